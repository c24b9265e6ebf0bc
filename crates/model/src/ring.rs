//! Pipelined-ring parallelism (prima.cpp, Li et al., arXiv 2504.08791, §3): the `L`
//! layers are cut into windows; a token travels `k` times around a ring of devices and,
//! in round `r`, device `i` runs the next `w_i` layers. So `Σ w_i = L / k`, and round `r`
//! of device `i` covers layers `r·W + Σ_{j<i} w_j .. + w_i` (`W = Σ w_j`). Device 0, the
//! head of the ring, also embeds the tokens and computes the output head.
//!
//! [`RingWindows`] is one device's part of such an assignment; [`RingLink`] is how the
//! head device hands the activations to the rest of the ring (`hearth-parallel` implements
//! it over TCP).

use crate::error::{ModelError, Result};
use crate::split::CollectiveError;
use std::ops::Range;

/// The layers one device runs: `rounds[r]` is its window in round `r` (empty when it
/// runs none in that round, e.g. a head device that only embeds and samples).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingWindows {
    /// One window per round.
    pub rounds: Vec<Range<usize>>,
}

impl RingWindows {
    /// Device `device`'s windows when `windows[i]` layers per round go to device `i` of
    /// the ring, in ring order, for a model of `n_layer` layers. Errors when the windows
    /// do not divide the layers into whole rounds (`n_layer` must be a multiple of
    /// `Σ windows`).
    pub fn from_assignment(n_layer: usize, windows: &[usize], device: usize) -> Result<Self> {
        let per_round = windows.iter().try_fold(0usize, |a, &w| a.checked_add(w)).unwrap_or(usize::MAX);
        if per_round == 0 || !n_layer.is_multiple_of(per_round) {
            return Err(ModelError::Input(format!(
                "layer windows {windows:?} cover {per_round} layers per round, which does not divide the model's {n_layer} layers \
                 into whole rounds"
            )));
        }
        if device >= windows.len() {
            return Err(ModelError::Input(format!("device {device} of a ring of {}", windows.len())));
        }
        let k = n_layer / per_round;
        let start: usize = windows[..device].iter().sum();
        let rounds = (0..k).map(|r| r * per_round + start..r * per_round + start + windows[device]).collect();
        Ok(Self { rounds })
    }

    /// Rounds per token (`k`).
    pub fn k(&self) -> usize {
        self.rounds.len()
    }

    /// Layers this device runs per token.
    pub fn n_layers(&self) -> usize {
        self.rounds.iter().map(|r| r.len()).sum()
    }

    /// `owned[il]`: whether this device runs layer `il`. Errors when a window reaches past
    /// `n_layer` or two windows overlap.
    pub fn owned(&self, n_layer: usize) -> Result<Vec<bool>> {
        let mut owned = vec![false; n_layer];
        for r in &self.rounds {
            if r.end > n_layer || r.start > r.end {
                return Err(ModelError::Input(format!("window {r:?} is outside the model's {n_layer} layers")));
            }
            for o in &mut owned[r.clone()] {
                if *o {
                    return Err(ModelError::Input(format!("windows {:?} overlap", self.rounds)));
                }
                *o = true;
            }
        }
        Ok(owned)
    }
}

/// The head device's link to the rest of the ring.
pub trait RingLink: Send {
    /// Hand `x: [n_tokens, n_embd]` (tokens at positions `pos0..`), which has been through
    /// the head device's window of round `round`, to the next device, and wait until it
    /// has been through every other device's window of that round and is back; the result
    /// replaces `x`.
    fn pass(&mut self, pos0: usize, round: usize, x: &mut [f32]) -> std::result::Result<(), CollectiveError>;

    /// Most `f32` elements one hop carries (the batch is capped to fit).
    fn max_elements(&self) -> usize;
}

#[cfg(test)]
mod tests {
    use super::RingWindows;

    #[test]
    fn windows_follow_rounds() {
        // 12 layers, windows 2,1,3 → W = 6, k = 2.
        let w = [2, 1, 3];
        let d: Vec<RingWindows> = (0..3).map(|i| RingWindows::from_assignment(12, &w, i).unwrap()).collect();
        assert_eq!(d[0].rounds, vec![0..2, 6..8]);
        assert_eq!(d[1].rounds, vec![2..3, 8..9]);
        assert_eq!(d[2].rounds, vec![3..6, 9..12]);
        let mut all = vec![0; 12];
        for x in &d {
            assert_eq!(x.k(), 2);
            for (il, o) in x.owned(12).unwrap().into_iter().enumerate() {
                all[il] += o as usize;
            }
        }
        assert_eq!(all, vec![1; 12]);
        // A head device running no layers.
        let h = RingWindows::from_assignment(4, &[0, 2], 0).unwrap();
        assert_eq!((h.rounds.clone(), h.n_layers()), (vec![0..0, 2..2], 0));
        assert!(RingWindows::from_assignment(12, &[2, 3], 0).is_err());
        assert!(RingWindows::from_assignment(12, &[0, 0], 0).is_err());
        assert!(RingWindows::from_assignment(12, &[6, 6], 2).is_err());
        assert!(RingWindows { rounds: vec![0..3, 2..4] }.owned(4).is_err());
        assert!(RingWindows { rounds: vec![0..2, 2..5] }.owned(4).is_err());
    }
}
