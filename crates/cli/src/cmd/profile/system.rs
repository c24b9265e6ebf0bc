//! What `/proc` and the kernels say about this machine: CPUs, SIMD level, RAM, swap.

/// Logical CPUs this process may use (`sched_getaffinity`, cgroup CPU quota), at least 1.
pub fn cores() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// The SIMD level hearth's kernels run at here (`avx512`, `avx2`, `scalar`).
pub fn simd() -> String {
    hearth_kernels::simd_level().to_string()
}

/// The CPU's model name (`model name` in /proc/cpuinfo; other architectures' fields as
/// fallbacks), or `unknown`.
pub fn cpu_model() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    ["model name", "Model", "cpu model", "Hardware", "CPU part"]
        .iter()
        .find_map(|key| {
            info.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == *key && !v.trim().is_empty()).then(|| v.trim().to_string())
            })
        })
        .unwrap_or_else(|| "unknown".into())
}

/// The largest last-level cache of CPU 0 in bytes (sysfs `cache/index*/size`), if known.
pub fn last_level_cache_bytes() -> Option<usize> {
    let dir = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    dir.filter_map(|e| {
        let s = std::fs::read_to_string(e.ok()?.path().join("size")).ok()?;
        let s = s.trim();
        let (n, mult) = match s.strip_suffix('K') {
            Some(n) => (n, 1 << 10),
            None => s.strip_suffix('M').map_or((s, 1), |n| (n, 1 << 20)),
        };
        n.parse::<usize>().ok().map(|n| n * mult)
    })
    .max()
}

/// This host's name, or `localhost`.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// RAM as the profile reports it, bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ram {
    /// `MemTotal`.
    pub total: u64,
    /// `MemAvailable`, lowered to the cgroup limit minus usage where that is smaller.
    pub available: u64,
    /// `SwapTotal`.
    pub swap: u64,
}

/// Reads /proc/meminfo and the cgroup limit (via [`hearth_memory::available_bytes`]).
pub fn ram() -> Option<Ram> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let total = meminfo_field(&info, "MemTotal")?;
    let available = hearth_memory::available_bytes().or_else(|| meminfo_field(&info, "MemAvailable"))?.min(total);
    Some(Ram { total, available, swap: meminfo_field(&info, "SwapTotal").unwrap_or(0) })
}

/// A `/proc/meminfo` field (`Key:   123 kB`) in bytes.
pub fn meminfo_field(info: &str, key: &str) -> Option<u64> {
    info.lines().find_map(|l| {
        let rest = l.strip_prefix(key)?.strip_prefix(':')?;
        let mut it = rest.split_whitespace();
        let n: u64 = it.next()?.parse().ok()?;
        Some(if it.next() == Some("kB") { n * 1024 } else { n })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_meminfo() {
        let s = "MemTotal:        2000 kB\nMemFree:  10 kB\nMemAvailable:    1500 kB\nSwapTotal:   0 kB\n";
        assert_eq!(meminfo_field(s, "MemTotal"), Some(2000 * 1024));
        assert_eq!(meminfo_field(s, "MemAvailable"), Some(1500 * 1024));
        assert_eq!(meminfo_field(s, "SwapTotal"), Some(0));
        assert_eq!(meminfo_field(s, "Mem"), None);
    }

    #[test]
    fn this_machine_is_sane() {
        let r = ram().unwrap();
        assert!(r.total > 0 && r.available <= r.total);
        assert!(cores() >= 1 && !cpu_model().is_empty());
    }
}
