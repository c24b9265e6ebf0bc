//! `<cache dir>/profile.json`: measured profiles keyed by a fingerprint of the hardware,
//! the build and what was measured, newest first, a few kept. A cache that cannot be
//! read or written is not an error (the profile is measured again).

use hearth_parallel::profile::DeviceProfile;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Profiles kept in the file (older ones, e.g. from earlier builds, are dropped).
const KEEP: usize = 8;

/// One cached profile.
#[derive(Serialize, Deserialize)]
struct Entry {
    fingerprint: String,
    profile: DeviceProfile,
}

/// The file's contents.
#[derive(Serialize, Deserialize, Default)]
struct CacheFile {
    entries: Vec<Entry>,
}

/// The fingerprint's parts: whatever changes the measured figures.
pub struct Fingerprint<'a> {
    /// `model name` from /proc/cpuinfo.
    pub cpu_model: &'a str,
    /// Logical CPUs available.
    pub cores: usize,
    /// `MemTotal`, bytes.
    pub ram_total: u64,
    /// SIMD level of the kernels.
    pub simd: &'a str,
    /// The file whose file system the disk figures describe.
    pub model: &'a Path,
    /// What was measured (`--quick`, thread counts, types).
    pub params: String,
}

impl Fingerprint<'_> {
    /// The key: hardware, hearth's version and binary modification time, the model's
    /// file-system device id, and the measurement parameters.
    pub fn key(&self) -> String {
        use std::os::unix::fs::MetadataExt;
        let mtime = |p: &Path| {
            std::fs::metadata(p)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos())
        };
        let exe = std::env::current_exe().map(|p| mtime(&p)).unwrap_or(0);
        let dev = std::fs::metadata(self.model).map(|m| m.dev()).unwrap_or(0);
        format!(
            "cpu={}|cores={}|ram={}|simd={}|hearth={}@{exe}|dev={dev}|{}",
            self.cpu_model,
            self.cores,
            self.ram_total,
            self.simd,
            env!("CARGO_PKG_VERSION"),
            self.params
        )
    }
}

/// `<cache dir>/profile.json`, if there is a cache directory.
pub fn path() -> Option<PathBuf> {
    hearth_parallel::model_hash::cache_dir().map(|d| d.join("profile.json"))
}

fn read(path: &Path) -> CacheFile {
    std::fs::read(path).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default()
}

/// The cached profile for `key`, if any.
pub fn load(path: &Path, key: &str) -> Option<DeviceProfile> {
    read(path).entries.into_iter().find(|e| e.fingerprint == key).map(|e| e.profile)
}

/// Store `profile` under `key` (replacing an entry with that key), atomically.
pub fn store(path: &Path, key: &str, profile: &DeviceProfile) -> std::io::Result<()> {
    let mut file = read(path);
    file.entries.retain(|e| e.fingerprint != key);
    file.entries.insert(0, Entry { fingerprint: key.to_string(), profile: profile.clone() });
    file.entries.truncate(KEEP);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension(format!("json.tmp{}", std::process::id()));
    std::fs::write(&tmp, serde_json::to_vec_pretty(&file).map_err(std::io::Error::other)?)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_then_load() {
        let dir = std::env::temp_dir().join(format!("hearth-profile-cache-{}", std::process::id()));
        let p = dir.join("profile.json");
        let prof = DeviceProfile { name: "x".into(), cores: 3, ..Default::default() };
        assert!(load(&p, "k").is_none());
        store(&p, "k", &prof).unwrap();
        store(&p, "other", &DeviceProfile::default()).unwrap();
        assert_eq!(load(&p, "k"), Some(prof));
        assert!(load(&p, "nope").is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
