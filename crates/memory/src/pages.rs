//! How much of a mapped file this process holds in 2 MiB pages, from `/proc/self/smaps`
//! (proc(5): `Rss`, `FilePmdMapped`, `ShmemPmdMapped` of each mapping).
//!
//! Why it is worth reporting: decode streams every weight once per token, and the weights
//! come through the mapping's pages; `hearth bench` compares decode with a read bandwidth
//! measured in 2 MiB pages. A file read into the page cache by readahead, or written in
//! 2 MiB pieces (`hearth_gguf::PieceWriter`), maps mostly in 2 MiB pages on ext4 and XFS;
//! one written in small pieces may sit in small folios until it leaves the page cache, and
//! decode then ran 13% slower on the Intel host of docs/BENCHMARKS.md (session 41).

use std::path::Path;

/// Resident bytes of one file's mappings in this process, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MappedPages {
    /// Resident bytes of the file's mappings (`Rss`).
    pub rss_bytes: u64,
    /// Of those, bytes mapped by 2 MiB page-table entries (`FilePmdMapped`, or
    /// `ShmemPmdMapped` for a file on tmpfs).
    pub huge_bytes: u64,
}

impl MappedPages {
    /// The mappings of `path` in `/proc/self/smaps`; `None` where that is unavailable
    /// (not Linux) or the file is not mapped.
    pub fn of_file(path: &Path) -> Option<Self> {
        let path = std::fs::canonicalize(path).ok()?;
        Self::parse(&std::fs::read_to_string("/proc/self/smaps").ok()?, path.to_str()?)
    }

    /// Sum the mappings of `path` in the text of a `/proc/[pid]/smaps` file (kB values).
    pub fn parse(smaps: &str, path: &str) -> Option<Self> {
        let mut sum = None::<Self>;
        let mut in_file = false;
        for line in smaps.lines() {
            let mut f = line.split_whitespace();
            let Some(first) = f.next() else { continue };
            if !first.ends_with(':') {
                // A mapping's header: "start-end perms offset dev inode [path]".
                let name = f.nth(4).map(|_| line.splitn(6, char::is_whitespace).last().unwrap_or("").trim());
                in_file = name == Some(path);
                if in_file {
                    sum.get_or_insert_with(Self::default);
                }
                continue;
            }
            let Some(s) = sum.as_mut().filter(|_| in_file) else { continue };
            let kb = || f.clone().next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0) * 1024;
            match first {
                "Rss:" => s.rss_bytes += kb(),
                "FilePmdMapped:" | "ShmemPmdMapped:" => s.huge_bytes += kb(),
                _ => {}
            }
        }
        sum
    }

    /// `huge_bytes / rss_bytes` (0 when nothing is resident).
    pub fn huge_fraction(&self) -> f64 {
        if self.rss_bytes == 0 {
            0.0
        } else {
            self.huge_bytes as f64 / self.rss_bytes as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
7f0000000000-7f0040000000 r--s 00000000 fd:00 1234                       /models/a b.gguf
Size:            1048576 kB
Rss:              900000 kB
FilePmdMapped:    819200 kB
ShmemPmdMapped:        0 kB
7f0040000000-7f0040001000 rw-p 00000000 00:00 0 
Rss:                   4 kB
FilePmdMapped:         0 kB
7f0050000000-7f0050200000 r--s 40000000 fd:00 1234                       /models/a b.gguf
Rss:                2048 kB
FilePmdMapped:      2048 kB
55d000000000-55d000100000 r-xp 00000000 fd:00 99                         /usr/bin/hearth
Rss:                1024 kB
FilePmdMapped:         0 kB
";

    #[test]
    fn sums_the_files_mappings_only() {
        let m = MappedPages::parse(SMAPS, "/models/a b.gguf").unwrap();
        assert_eq!(m, MappedPages { rss_bytes: (900000 + 2048) * 1024, huge_bytes: (819200 + 2048) * 1024 });
        assert!((m.huge_fraction() - 821248.0 / 902048.0).abs() < 1e-12);
        assert_eq!(MappedPages::parse(SMAPS, "/models/other.gguf"), None);
        assert_eq!(MappedPages::parse(SMAPS, "/usr/bin/hearth").unwrap().huge_bytes, 0);
    }

    #[test]
    fn reads_this_process() {
        // The test binary maps itself; its Rss is resident whatever its page size.
        if let Some(exe) = std::env::current_exe().ok().filter(|_| Path::new("/proc/self/smaps").exists()) {
            let m = MappedPages::of_file(&exe).expect("the test binary is mapped");
            assert!(m.rss_bytes > 0 && m.huge_bytes <= m.rss_bytes);
        }
    }
}
