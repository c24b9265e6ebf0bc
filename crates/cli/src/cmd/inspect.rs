//! `hearth inspect`: metadata (long arrays summarised), tensor table, totals per type.

use crate::common::print_out;
use anyhow::{Context as _, Result};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

/// Flags of `hearth inspect`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// GGUF file
    #[arg(required_unless_present = "model", conflicts_with = "model")]
    pub file: Option<PathBuf>,
    /// GGUF file, as the other commands take it
    #[arg(short, long, value_name = "PATH")]
    pub model: Option<PathBuf>,
    /// Print one JSON object (metadata with arrays summarised to their first items)
    #[arg(long)]
    pub json: bool,
    /// Array items to show
    #[arg(long, default_value_t = 8)]
    pub max_items: usize,
}

pub fn run(a: Args) -> Result<()> {
    // (clap requires one of the two.)
    let file = a.file.or(a.model).context("give the GGUF file")?;
    let f = crate::common::open_gguf(&file)?;
    let mut totals: BTreeMap<&str, (usize, u64, u64)> = BTreeMap::new();
    for t in f.tensors() {
        let e = totals.entry(t.ty.name()).or_default();
        e.0 += 1;
        e.1 += t.n_elements();
        e.2 += t.size;
    }
    if a.json {
        let meta: serde_json::Map<String, serde_json::Value> = f
            .metadata()
            .iter()
            .map(|(k, v)| {
                let j = match v.as_array() {
                    Some(items) if items.len() > a.max_items => serde_json::json!({
                        "type": "array", "len": items.len(),
                        "head": items[..a.max_items].iter().map(|x| x.to_json()).collect::<Vec<_>>()}),
                    _ => v.to_json(),
                };
                (k.clone(), j)
            })
            .collect();
        let tensors: Vec<_> = f
            .tensors()
            .iter()
            .map(|t| serde_json::json!({"name": t.name, "type": t.ty.name(), "shape": t.dims, "offset": t.offset, "bytes": t.size}))
            .collect();
        let by_type: serde_json::Map<_, _> =
            totals.iter().map(|(k, (n, el, b))| (k.to_string(), serde_json::json!({"tensors": n, "elements": el, "bytes": b}))).collect();
        let v = serde_json::json!({"version": f.version(), "alignment": f.alignment(), "data_offset": f.data_offset(),
            "metadata": meta, "tensors": tensors, "totals": by_type});
        return print_out(&format!("{v}\n"));
    }
    let mut o = String::new();
    writeln!(
        o,
        "GGUF v{} · {} metadata keys · {} tensors · data at offset {}",
        f.version(),
        f.metadata().len(),
        f.tensors().len(),
        f.data_offset()
    )?;
    writeln!(o, "\nmetadata:")?;
    for (k, v) in f.metadata() {
        writeln!(o, "  {k:<44} {}", v.summary(a.max_items))?;
    }
    if !f.tensors().is_empty() {
        writeln!(o, "\n{:<36} {:>7} {:>20} {:>12}", "tensor", "type", "shape", "bytes")?;
        for t in f.tensors() {
            let shape = t.dims.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(" x ");
            writeln!(o, "{:<36} {:>7} {:>20} {:>12}", t.name, t.ty.name(), shape, t.size)?;
        }
    }
    writeln!(o, "\n{:<8} {:>8} {:>14} {:>14}", "type", "tensors", "elements", "bytes")?;
    let (mut n_all, mut el_all, mut b_all) = (0, 0, 0);
    for (ty, (n, el, b)) in &totals {
        writeln!(o, "{ty:<8} {n:>8} {el:>14} {b:>14}")?;
        (n_all, el_all, b_all) = (n_all + n, el_all + el, b_all + b);
    }
    writeln!(o, "{:<8} {n_all:>8} {el_all:>14} {b_all:>14}", "total")?;
    print_out(&o)
}
