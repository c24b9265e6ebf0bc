//! GGUF reader: round trips through the writer, and hostile input (truncations,
//! absurd counts/shapes/offsets, random mutations) that must give typed errors.

use hearth_gguf::{string_array, write_gguf, GgufError, GgufFile, TensorSpec, Value};
use hearth_quant::GgmlType;
use proptest::prelude::*;

fn sample_file() -> Vec<u8> {
    let meta = vec![
        ("general.architecture".to_string(), Value::String("llama".into())),
        ("general.alignment".to_string(), Value::U32(64)),
        ("llama.block_count".to_string(), Value::U32(2)),
        ("llama.rope.freq_base".to_string(), Value::F32(10000.0)),
        ("flag".to_string(), Value::Bool(true)),
        ("tokens".to_string(), string_array(["a", "b", "ü"])),
        (
            "nested".to_string(),
            Value::Array {
                elem_type: hearth_gguf::value_type::ARRAY,
                items: vec![Value::Array { elem_type: hearth_gguf::value_type::I64, items: vec![Value::I64(-5)] }],
            },
        ),
    ];
    let tensors = vec![
        TensorSpec { name: "a".into(), dims: vec![64, 3], ty: GgmlType::Q8_0 },
        TensorSpec { name: "b".into(), dims: vec![5], ty: GgmlType::F32 },
    ];
    write_gguf(Vec::new(), &meta, &tensors, |i, w| {
        let n = tensors[i].size().unwrap() as usize;
        w.write_all(&vec![i as u8 + 1; n])
    })
    .unwrap()
}

#[test]
fn round_trip() {
    let f = GgufFile::from_vec(sample_file()).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 64);
    assert_eq!(f.data_offset() % 64, 0);
    assert_eq!(f.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(f.get_u64("llama.block_count").unwrap(), 2);
    assert_eq!(f.get_f32("llama.rope.freq_base").unwrap(), 10000.0);
    assert_eq!(f.get_bool_opt("flag").unwrap(), Some(true));
    assert_eq!(f.get_array("tokens").unwrap()[2], Value::String("ü".into()));
    let a = f.tensor("a").unwrap();
    assert_eq!(a.dims, vec![64, 3]);
    assert_eq!(a.size, 3 * 2 * 34);
    assert!(f.tensor_data(a).iter().all(|&b| b == 1));
    let b = f.tensor("b").unwrap();
    assert_eq!(b.offset % 64, 0);
    assert_eq!(f.tensor_data(b), &[2u8; 20]);
    assert!(matches!(f.get_str("llama.block_count"), Err(GgufError::Metadata { .. })));
    assert!(matches!(f.get_str("missing"), Err(GgufError::Metadata { .. })));
}

#[test]
fn every_truncation_is_an_error() {
    let full = sample_file();
    // The writer pads after the last tensor too; cutting only that padding is harmless.
    let f = GgufFile::from_vec(full.clone()).unwrap();
    let end = f.tensors().iter().map(|t| f.data_offset() + t.offset + t.size).max().unwrap() as usize;
    assert!(GgufFile::from_vec(full[..end].to_vec()).is_ok());
    for cut in 0..end {
        let r = GgufFile::from_vec(full[..cut].to_vec());
        assert!(r.is_err(), "cut at {cut} of {} parsed", full.len());
    }
}

fn patch_u64(buf: &mut [u8], at: usize, v: u64) {
    buf[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

#[test]
fn absurd_counts_are_rejected_without_allocation() {
    let full = sample_file();
    // tensor_count at offset 8, kv count at 16.
    for (at, field) in [(8, "tensor_count"), (16, "metadata_kv_count")] {
        let mut b = full.clone();
        patch_u64(&mut b, at, u64::MAX / 2);
        let e = GgufFile::from_vec(b).err().expect("must fail").to_string();
        assert!(e.contains(field), "{e}");
    }
    // First key length absurd.
    let mut b = full.clone();
    patch_u64(&mut b, 24, u64::MAX);
    assert!(matches!(GgufFile::from_vec(b), Err(GgufError::Truncated { .. })));
}

fn find(buf: &[u8], needle: &[u8]) -> usize {
    buf.windows(needle.len()).position(|w| w == needle).unwrap()
}

#[test]
fn absurd_tensor_fields_are_rejected() {
    let full = sample_file();
    // Tensor "b" info: name len(8) "b" n_dims(4) dim(8) type(4) offset(8).
    let name_at = find(&full, &[1, 0, 0, 0, 0, 0, 0, 0, b'b', 1, 0, 0, 0]) + 9;
    let dims_at = name_at + 4;
    let type_at = dims_at + 8;
    let off_at = type_at + 4;
    let cases: Vec<(usize, Vec<u8>, &str)> = vec![
        (name_at, 9u32.to_le_bytes().to_vec(), "n_dims"),
        (dims_at, u64::MAX.to_le_bytes().to_vec(), "dimension"),
        (dims_at, 0u64.to_le_bytes().to_vec(), "dimension"),
        (type_at, 4u32.to_le_bytes().to_vec(), "unknown tensor type"),
        (type_at, 2u32.to_le_bytes().to_vec(), "block size"),
        (off_at, (1u64 << 40).to_le_bytes().to_vec(), "beyond the end"),
        (off_at, 3u64.to_le_bytes().to_vec(), "aligned"),
        (off_at, 0u64.to_le_bytes().to_vec(), "overlaps"),
    ];
    for (at, bytes, want) in cases {
        let mut b = full.clone();
        b[at..at + bytes.len()].copy_from_slice(&bytes);
        let e = GgufFile::from_vec(b).err().expect("must fail").to_string();
        assert!(e.contains(want), "expected {want:?} in {e}");
        // Where its data lies is wrong: the offset named is the data's, and says so.
        if want == "beyond the end" || want == "overlaps" {
            assert!(e.contains("tensor \"b\" data at offset"), "{e}");
        }
    }
}

#[test]
fn bad_magic_and_version() {
    assert!(matches!(GgufFile::from_vec(b"GGML0000".to_vec()), Err(GgufError::BadMagic { .. })));
    assert!(matches!(GgufFile::from_vec(vec![]), Err(GgufError::BadMagic { .. })));
    let mut b = sample_file();
    b[4] = 1;
    assert!(matches!(GgufFile::from_vec(b), Err(GgufError::UnsupportedVersion(1))));
}

#[test]
fn missing_file_is_io_error() {
    let e = GgufFile::open("/nonexistent/model.gguf").err().unwrap();
    assert!(matches!(e, GgufError::Io { .. }));
    assert!(e.to_string().contains("/nonexistent/model.gguf"));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]
    /// Random byte mutations never panic; when parsing succeeds every tensor view is in bounds.
    #[test]
    fn mutated_files_never_panic(edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8)) {
        let mut b = sample_file();
        for (i, v) in edits { let at = i.index(b.len()); b[at] = v; }
        if let Ok(f) = GgufFile::from_vec(b) {
            for t in f.tensors() { prop_assert_eq!(f.tensor_data(t).len() as u64, t.size); }
        }
    }
}

/// Every vocab-only file of llama.cpp's tokenizer suite and the default model parse.
#[test]
fn real_files_parse() {
    let root = std::env::var("HEARTH_REFERENCE_DIR")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/reference").into());
    let vocab = std::path::Path::new(&root).join("vocab");
    let Ok(dir) = std::fs::read_dir(&vocab) else {
        eprintln!("skipping: no reference data at {}", vocab.display());
        return;
    };
    let mut n = 0;
    for e in dir.flatten() {
        if e.path().extension().is_some_and(|x| x == "gguf") {
            let f = GgufFile::open(e.path()).unwrap_or_else(|err| panic!("{}: {err}", e.path().display()));
            assert!(f.get_array("tokenizer.ggml.tokens").unwrap().len() > 1000);
            n += 1;
        }
    }
    assert!(n >= 7);
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if let Ok(f) = GgufFile::open(model) {
        assert_eq!(f.tensors().len(), 272);
        assert_eq!(f.tensor("token_embd.weight").unwrap().ty, GgmlType::Q8_0);
        assert_eq!(f.tensor("token_embd.weight").unwrap().dims, vec![576, 49152]);
    }
}
