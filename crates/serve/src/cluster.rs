//! Serving across devices (`hearth serve --workers …`, `--parallel ring`): when a worker
//! fails in a forward pass (its link broke, it timed out), every request in flight gets a
//! 503 naming it, and the scheduler sets its engine up again over the devices left
//! ([`hearth_engine::EngineOptions::without_node`]; a ring's solver re-plans) before it
//! takes the next request. `/health` and `/metrics` show the devices and how often the
//! engine was re-planned ([`ClusterState`]).

use hearth_engine::{EngineOptions, Prepared};
use hearth_model::{Context, Model, ModelError};
use std::sync::{Arc, Mutex};

/// One device of the group, as `/health` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeState {
    /// `this machine` or the worker's `HOST:PORT`.
    pub addr: String,
    /// Whether it takes part in the current engine.
    pub up: bool,
    /// It failed (else, when not up, the plan leaves it out: a ring's solver gave it no layers).
    pub failed: bool,
}

impl NodeState {
    /// `up`, `down` (failed) or `unused` (alive as far as known, left out by the plan).
    pub fn state(&self) -> &'static str {
        match (self.up, self.failed) {
            (true, _) => "up",
            (false, true) => "down",
            (false, false) => "unused",
        }
    }
}

/// The group an engine runs in.
#[derive(Debug, Clone, Default)]
pub struct ClusterState {
    /// `tensor` or `ring`; `single` once no worker is left.
    pub layout: &'static str,
    /// This machine first, then every worker ever in the group (failed ones `up: false`).
    pub nodes: Vec<NodeState>,
    /// Times the engine was set up again after a failure.
    pub replans: u64,
    /// The last failure, for `/health`.
    pub last_failure: Option<String>,
}

impl ClusterState {
    /// The state of a freshly prepared engine over `members` of the `workers` named.
    pub fn new(layout: &'static str, workers: &[String], members: &[String]) -> Self {
        let mut nodes = vec![NodeState { addr: "this machine".into(), up: true, failed: false }];
        nodes.extend(workers.iter().map(|w| NodeState { addr: w.clone(), up: members.contains(w), failed: false }));
        Self { layout, nodes, replans: 0, last_failure: None }
    }

    /// Worker `addr` failed (`why`): down from now on.
    pub fn fail(&mut self, addr: &str, why: &str) {
        for n in self.nodes.iter_mut().filter(|n| n.addr == addr) {
            (n.up, n.failed) = (false, true);
        }
        self.last_failure = Some(why.to_string());
    }

    /// `/health`'s `cluster` object.
    pub fn json(&self) -> serde_json::Value {
        let nodes: Vec<_> = self.nodes.iter().map(|n| serde_json::json!({"addr": n.addr, "up": n.up, "state": n.state()})).collect();
        serde_json::json!({
            "layout": self.layout,
            "nodes": nodes,
            "nodes_up": self.nodes.iter().filter(|n| n.up).count(),
            "replans": self.replans,
            "last_failure": self.last_failure,
        })
    }
}

/// How to set an engine up again without a failed worker.
pub struct Replanner {
    model: Arc<Model>,
    opts: EngineOptions,
    state: Arc<Mutex<Option<ClusterState>>>,
}

impl Replanner {
    /// For an engine prepared with `opts`; `state` is what `/health` shows (the server's
    /// [`crate::metrics::Metrics::cluster`]).
    pub fn new(model: Arc<Model>, opts: EngineOptions, state: Arc<Mutex<Option<ClusterState>>>) -> Self {
        Self { model, opts, state }
    }

    /// The worker `e` blames, if it was one worker's failure: its node index and a message
    /// naming it for the requests in flight. `/health` shows it down from now on.
    pub fn failed(&self, e: &ModelError) -> Option<(usize, String)> {
        let node = hearth_engine::failed_worker(e)?;
        let addr = self.opts.cluster.as_ref()?.workers.get(node - 1)?.clone();
        let msg = format!(
            "worker {addr} (node {node}) failed during the forward pass: {e}; the server is re-planning over the devices left, retry the request"
        );
        self.state.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(ClusterState::default).fail(&addr, &msg);
        Some((node, msg))
    }

    /// Set the engine up again without worker `node` (≥ 1), after dropping `old` (its
    /// links close, so the workers left end their session and accept the new one). When
    /// that fails too, the engine runs on this machine alone; `None` if even that fails.
    /// Blocks while connecting (and re-sending shards, or re-solving a ring).
    pub fn replan(&mut self, old: Context, node: usize, failure: &str) -> Option<Context> {
        drop(old);
        let failed_addr = self.opts.cluster.as_ref().and_then(|c| c.workers.get(node - 1).cloned());
        let mut opts = self.opts.without_node(node);
        let prepared = match hearth_engine::prepare(&self.model, &opts) {
            Ok(p) => Ok(p),
            Err(e) if opts.cluster.is_some() => {
                eprintln!("hearth serve: re-planning over the workers left failed ({e:#}); going on with this machine alone");
                opts.cluster = None;
                hearth_engine::prepare(&self.model, &opts)
            }
            Err(e) => Err(e),
        };
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let st = state.get_or_insert_with(ClusterState::default);
        st.replans += 1;
        if let Some(a) = &failed_addr {
            st.fail(a, failure);
        }
        match prepared {
            Ok(Prepared { ctx, cluster, .. }) => {
                let members: Vec<String> = cluster.as_ref().map(|c| c.workers.clone()).unwrap_or_default();
                st.layout = cluster.as_ref().map_or("single", |c| c.layout());
                for n in st.nodes.iter_mut().skip(1) {
                    n.up = members.contains(&n.addr);
                }
                let had_windows =
                    self.opts.cluster.as_ref().is_some_and(|c| matches!(&c.layout, hearth_parallel::Layout::Ring { windows: Some(_), .. }));
                if had_windows {
                    eprintln!("hearth serve: the ring's --layer-window no longer applies without {}: the layer solver chose the windows", failed_addr.as_deref().unwrap_or("that worker"));
                }
                eprintln!(
                    "hearth serve: {} left out; serving on {} device(s) ({})",
                    failed_addr.as_deref().unwrap_or("a worker"),
                    members.len() + 1,
                    st.layout
                );
                self.opts = opts;
                Some(ctx)
            }
            Err(e) => {
                eprintln!("hearth serve: cannot set the engine up again: {e:#}");
                for n in st.nodes.iter_mut() {
                    n.up = false;
                }
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_lists_every_node_and_tells_failed_from_unused() {
        let w: Vec<String> = vec!["10.0.0.2:7070".into(), "10.0.0.3:7070".into(), "10.0.0.4:7070".into()];
        let mut s = ClusterState::new("ring", &w, &w[..2]);
        s.fail("10.0.0.3:7070", "gone");
        s.replans = 1;
        let j = s.json();
        assert_eq!(j["layout"], "ring");
        assert_eq!(j["nodes"].as_array().map(Vec::len), Some(4));
        assert_eq!(j["nodes_up"], 2);
        let states: Vec<&str> = (0..4).map(|i| j["nodes"][i]["state"].as_str().unwrap()).collect();
        assert_eq!(states, ["up", "up", "down", "unused"]);
        assert_eq!(j["last_failure"], "gone");
    }
}
