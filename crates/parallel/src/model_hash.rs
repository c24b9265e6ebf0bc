//! The model file's SHA-256, which coordinator and workers compare at handshake.
//!
//! Hashing a 4 GB file takes seconds, so the digest is cached per file in
//! `$HEARTH_CACHE_DIR` (default `$XDG_CACHE_HOME/hearth`, else `~/.cache/hearth`),
//! keyed by the canonical path and checked against the file's size and modification
//! time; a changed file is hashed again. A cache that cannot be written is not an error.

use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// The directory hearth caches per-machine data in (see the module docs), if any.
pub fn cache_dir() -> Option<PathBuf> {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    env("HEARTH_CACHE_DIR")
        .or_else(|| env("XDG_CACHE_HOME").map(|d| d.join("hearth")))
        .or_else(|| env("HOME").map(|d| d.join(".cache").join("hearth")))
}

/// SHA-256 of the file at `path` (cached; see the module docs).
pub fn file_sha256(path: &Path) -> io::Result<[u8; 32]> {
    let meta = std::fs::metadata(path)?;
    let mtime = meta.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map_or(0, |d| d.as_nanos());
    let stamp = format!("{} {}", meta.len(), mtime);
    let entry = cache_dir().map(|d| {
        let canon = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        let key = hex(&Sha256::digest(canon.to_string_lossy().as_bytes())[..12]);
        d.join("sha256").join(key)
    });
    if let Some(text) = entry.as_ref().and_then(|e| std::fs::read_to_string(e).ok()) {
        if let Some((s, h)) = text.trim().rsplit_once(' ') {
            if s == stamp {
                if let Some(d) = unhex(h) {
                    return Ok(d);
                }
            }
        }
    }
    let digest = hash_reader(File::open(path)?)?;
    if let Some(e) = entry {
        let _ = e.parent().map(std::fs::create_dir_all);
        let _ = std::fs::write(&e, format!("{stamp} {}\n", hex(&digest)));
    }
    Ok(digest)
}

/// SHA-256 of everything `r` yields.
pub fn hash_reader(mut r: impl Read) -> io::Result<[u8; 32]> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 4 << 20];
    loop {
        match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => h.update(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(h.finalize().into())
}

fn hex(b: &[u8]) -> String {
    crate::wire::hex(b)
}

fn unhex(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_digest_and_cache() {
        // SHA-256("abc") from FIPS 180-2, appendix B.1.
        let d = hash_reader(&b"abc"[..]).unwrap();
        assert_eq!(hex(&d), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        let dir = std::env::temp_dir().join(format!("hearth-hash-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("m.bin");
        std::fs::write(&f, b"abc").unwrap();
        let first = file_sha256(&f).unwrap();
        let second = file_sha256(&f).unwrap();
        assert_eq!(first, d);
        assert_eq!(second, d);
        std::fs::write(&f, b"abcd").unwrap();
        assert_ne!(file_sha256(&f).unwrap(), d, "a changed file is hashed again");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
