//! CPU pinning for the thread pool (`--pin`).
//!
//! Order: one logical CPU per physical core first (distinct `(physical_package_id, core_id)`
//! in `/sys/devices/system/cpu/cpu*/topology`, lowest CPU number of each), then the
//! remaining SMT siblings, all restricted to the CPUs this process may run on
//! (`sched_getaffinity`, which reflects cpusets and `taskset`). So `-t N --pin` puts N
//! threads on N distinct cores whenever there are that many, as llama.cpp's
//! `--cpu-strict` / numactl users would arrange by hand.

use std::collections::BTreeMap;

/// Logical CPUs this process may use, in pinning order. Empty where the OS does not say.
pub fn pin_order() -> Vec<usize> {
    // (package, core) → its CPUs in ascending order; a CPU without topology is its own core.
    let mut cores: BTreeMap<(String, String), Vec<usize>> = BTreeMap::new();
    for cpu in allowed_cpus() {
        let key = core_of(cpu).unwrap_or_else(|| (String::new(), cpu.to_string()));
        cores.entry(key).or_default().push(cpu);
    }
    let mut firsts: Vec<usize> = cores.values().map(|c| c[0]).collect();
    firsts.sort_unstable();
    let mut rest: Vec<usize> = cores.values().flat_map(|c| c[1..].iter().copied()).collect();
    rest.sort_unstable();
    firsts.extend(rest);
    firsts
}

/// The `(physical_package_id, core_id)` of logical CPU `cpu`, from
/// `/sys/devices/system/cpu/cpu{cpu}/topology`.
pub(crate) fn core_of(cpu: usize) -> Option<(String, String)> {
    let read = |f: &str| {
        std::fs::read_to_string(format!("/sys/devices/system/cpu/cpu{cpu}/topology/{f}")).ok().map(|s| s.trim().to_owned())
    };
    Some((read("physical_package_id")?, read("core_id")?))
}

/// Pin the calling thread to logical CPU `cpu`.
pub fn pin_current_thread(cpu: usize) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        if cpu >= libc::CPU_SETSIZE as usize {
            return Err(std::io::Error::other(format!("CPU {cpu} is beyond CPU_SETSIZE")));
        }
        // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET stays in bounds (checked
        // above); sched_setaffinity(0, …) affects only the calling thread.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = cpu;
        Err(std::io::Error::other("thread pinning is only implemented on Linux"))
    }
}

/// The CPU the calling thread is running on now (`sched_getcpu`), where known.
pub fn current_cpu() -> Option<usize> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: no arguments; returns -1 on error.
        let c = unsafe { libc::sched_getcpu() };
        (c >= 0).then_some(c as usize)
    }
    #[cfg(not(target_os = "linux"))]
    None
}

fn allowed_cpus() -> Vec<usize> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: sched_getaffinity fills the zeroed set for this process; CPU_ISSET reads
        // indices below CPU_SETSIZE only.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0 {
                return (0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).collect();
            }
        }
    }
    (0..std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_covers_the_allowed_cpus_once() {
        let order = pin_order();
        let mut sorted = order.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), order.len());
        assert_eq!(sorted, allowed_cpus());
    }

    #[test]
    fn pinning_moves_the_thread() {
        let order = pin_order();
        let last = *order.last().unwrap();
        std::thread::spawn(move || {
            pin_current_thread(last).unwrap();
            assert_eq!(current_cpu(), Some(last));
        })
        .join()
        .unwrap();
        assert!(pin_current_thread(usize::MAX).is_err());
    }
}
