//! Worker groups: several engines (a [`Scheduler`] each, with its own context, KV cache
//! slots and threads, possibly pinned to disjoint cores) behind one HTTP front. Each
//! request goes to the least-loaded engine (fewest requests queued or generating).

use crate::error::ApiError;
use crate::scheduler::Scheduler;
use crate::sequence::Job;

/// The engines a server routes to (at least one).
#[derive(Clone)]
pub struct Engines(Vec<Scheduler>);

impl Engines {
    /// Route over `engines`; `None` when there are none.
    pub fn new(engines: Vec<Scheduler>) -> Option<Self> {
        (!engines.is_empty()).then_some(Self(engines))
    }

    /// Submit to the least-loaded engine (ties: the first); if its queue is full, try
    /// the others in order of load before answering 429.
    pub fn submit(&self, mut job: Job) -> Result<(), ApiError> {
        let mut order: Vec<&Scheduler> = self.0.iter().collect();
        order.sort_by_key(|s| s.load());
        let mut last = None;
        for s in order {
            match s.submit(job) {
                Ok(()) => return Ok(()),
                Err(back) => {
                    let (e, j) = *back;
                    last = Some(e);
                    job = j;
                }
            }
        }
        Err(last.unwrap_or_else(ApiError::unavailable))
    }

    /// Positions of each slot (the same in every engine).
    pub fn n_ctx(&self) -> usize {
        self.0[0].n_ctx()
    }

    /// Slots over all engines.
    pub fn n_slots(&self) -> usize {
        self.0.iter().map(Scheduler::n_slots).sum()
    }

    /// Requests that may wait, over all engines.
    pub fn queue_size(&self) -> usize {
        self.0.iter().map(Scheduler::queue_size).sum()
    }

    /// Engines.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Never true (there is at least one engine).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}
