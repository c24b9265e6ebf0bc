//! CPUs for worker groups (`--groups G --pin`): NUMA nodes first, then cores. The CPUs
//! this process may use, in the kernels' pinning order (one per physical core first,
//! then SMT siblings), are stably sorted by NUMA node and cut into consecutive runs of
//! `threads`, so a group stays within one node whenever the node has room for it.

use std::collections::BTreeMap;

/// Parse a sysfs CPU list such as `0-3,8,10-11`; malformed parts are skipped.
pub fn parse_cpulist(s: &str) -> Vec<usize> {
    let mut out = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.trim().parse::<usize>(), b.trim().parse::<usize>()) {
                    out.extend(a..=b);
                }
            }
            None => out.extend(part.trim().parse::<usize>().ok()),
        }
    }
    out
}

/// The NUMA node of each CPU, from `/sys/devices/system/node/node*/cpulist` (empty
/// where the system does not say: then every CPU counts as node 0).
pub fn numa_nodes() -> BTreeMap<usize, usize> {
    let mut map = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir("/sys/devices/system/node") else { return map };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(node) = name.strip_prefix("node").and_then(|n| n.parse::<usize>().ok()) else { continue };
        if let Ok(list) = std::fs::read_to_string(e.path().join("cpulist")) {
            for cpu in parse_cpulist(&list) {
                map.insert(cpu, node);
            }
        }
    }
    map
}

/// `groups` runs of `threads` CPUs from `order` (pinning order), NUMA nodes first.
pub fn group_cpus(order: &[usize], node_of: &BTreeMap<usize, usize>, groups: usize, threads: usize) -> Result<Vec<Vec<usize>>, String> {
    let need = groups * threads;
    if need > order.len() {
        return Err(format!("{groups} groups × {threads} threads need {need} CPUs; this process may use {}", order.len()));
    }
    let mut cpus = order.to_vec();
    cpus.sort_by_key(|c| node_of.get(c).copied().unwrap_or(0)); // stable: keeps the core order within a node
    Ok(cpus.chunks(threads.max(1)).take(groups).map(<[usize]>::to_vec).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cpu_lists() {
        assert_eq!(parse_cpulist("0-3,8,10-11\n"), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(parse_cpulist(""), Vec::<usize>::new());
        assert_eq!(parse_cpulist("x,2"), vec![2]);
    }

    #[test]
    fn groups_fill_one_node_before_the_next() {
        // Two nodes of 4 CPUs, SMT siblings 4-7 / 12-15 listed after the cores by pin_order.
        let order = [0, 1, 8, 9, 4, 5, 12, 13];
        let nodes: BTreeMap<usize, usize> = [(0, 0), (1, 0), (4, 0), (5, 0), (8, 1), (9, 1), (12, 1), (13, 1)].into();
        assert_eq!(group_cpus(&order, &nodes, 2, 4).unwrap(), vec![vec![0, 1, 4, 5], vec![8, 9, 12, 13]]);
        assert_eq!(group_cpus(&order, &nodes, 4, 2).unwrap(), vec![vec![0, 1], vec![4, 5], vec![8, 9], vec![12, 13]]);
        assert_eq!(group_cpus(&order, &BTreeMap::new(), 2, 1).unwrap(), vec![vec![0], vec![1]]);
        assert!(group_cpus(&order, &nodes, 3, 3).is_err());
    }
}
