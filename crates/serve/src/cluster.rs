//! Serving across devices (`hearth serve --workers …`, `--parallel ring`): when a worker
//! fails in a forward pass (its link broke, it timed out), every request in flight gets a
//! 503 naming it, and the scheduler sets its engine up again over the devices left
//! ([`hearth_engine::EngineOptions::without_node`]; a ring's solver re-plans) before it
//! takes the next request. While idle it looks for the failed workers again (`--rejoin`)
//! and sets the engine up with those that answer. `/health` and `/metrics` show the
//! devices and how often the engine was re-planned ([`ClusterState`]).

use hearth_engine::{EngineOptions, Prepared};
use hearth_model::{Context, Model, ModelError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
    /// Times the engine was set up again after a failure or a rejoin.
    pub replans: u64,
    /// Times down workers were taken in again (`--rejoin`).
    pub rejoins: u64,
    /// The last failure, for `/health`.
    pub last_failure: Option<String>,
}

impl ClusterState {
    /// The state of a freshly prepared engine over `members` of the `workers` named.
    pub fn new(layout: &'static str, workers: &[String], members: &[String]) -> Self {
        let mut nodes = vec![NodeState { addr: "this machine".into(), up: true, failed: false }];
        nodes.extend(workers.iter().map(|w| NodeState { addr: w.clone(), up: members.contains(w), failed: false }));
        Self { layout, nodes, replans: 0, rejoins: 0, last_failure: None }
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
            "rejoins": self.rejoins,
            "last_failure": self.last_failure,
        })
    }
}

/// How to set an engine up again without a failed worker, and with it once it answers
/// again (`--rejoin`).
pub struct Replanner {
    model: Arc<Model>,
    /// The options the engine was first prepared with: every worker named.
    base: EngineOptions,
    /// The options of the engine now: `base` without the workers in `down`.
    opts: EngineOptions,
    state: Arc<Mutex<Option<ClusterState>>>,
    /// Workers left out because they failed (addresses as named), to look for again
    /// unless in `taken`.
    down: Vec<String>,
    /// Down workers another coordinator took over: never looked for.
    taken: Vec<String>,
    /// How long after a failure to look for the down workers again (`None`: never).
    rejoin: Option<Duration>,
    /// The wait before the next look: `rejoin`, doubled after each failed attempt to take
    /// a worker in again (up to [`MAX_REJOIN_WAIT`]).
    wait: Duration,
    next_look: Instant,
}

/// The longest wait between looks for a down worker whose last attempt to rejoin failed.
const MAX_REJOIN_WAIT: Duration = Duration::from_secs(600);
/// How long a look waits for a down worker to accept a TCP connection.
const LOOK_TIMEOUT: Duration = Duration::from_millis(500);

impl Replanner {
    /// For an engine prepared with `opts`; `state` is what `/health` shows (the server's
    /// [`crate::metrics::Metrics::cluster`]); `rejoin`: how long after a failure to look
    /// for the failed worker again (`None`: never).
    pub fn new(model: Arc<Model>, opts: EngineOptions, state: Arc<Mutex<Option<ClusterState>>>, rejoin: Option<Duration>) -> Self {
        let wait = rejoin.unwrap_or(MAX_REJOIN_WAIT);
        Self { model, base: opts.clone(), opts, state, down: Vec::new(), taken: Vec::new(), rejoin, wait, next_look: Instant::now() }
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
        if let Some(a) = failed_addr.iter().find(|a| !self.down.contains(a)) {
            self.down.push(a.clone());
        }
        // Another coordinator took the worker over (it says so): taking it back would end
        // that one's session, which would take it back again, and so on. Left out for good.
        if failure.contains(hearth_parallel::TAKEN_OVER) {
            if let Some(a) = &failed_addr {
                self.taken.push(a.clone());
                if self.rejoin.is_some() {
                    eprintln!("hearth serve: {a} was taken over by another coordinator: it is not looked for again (--rejoin)");
                }
            }
        }
        (self.wait, self.next_look) = (self.rejoin.unwrap_or(MAX_REJOIN_WAIT), Instant::now() + self.rejoin.unwrap_or(MAX_REJOIN_WAIT));
        let opts = self.without_down();
        if let Some(a) = &failed_addr {
            self.state.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(ClusterState::default).fail(a, failure);
        }
        let had_windows =
            self.opts.cluster.as_ref().is_some_and(|c| matches!(&c.layout, hearth_parallel::Layout::Ring { windows: Some(_), .. }));
        let ctx = self.prepare(opts, "re-planning over the workers left")?;
        if had_windows && self.opts.cluster.is_some() {
            eprintln!(
                "hearth serve: the ring's --layer-window no longer applies without {}: the layer solver chose the windows",
                failed_addr.as_deref().unwrap_or("that worker")
            );
        }
        eprintln!("hearth serve: {} left out; serving on {}", failed_addr.as_deref().unwrap_or("a worker"), self.serving_on());
        Some(ctx)
    }

    /// How long until the down workers are due to be looked for again; `None` when none
    /// is down or `--rejoin` is off.
    pub fn look_in(&self) -> Option<Duration> {
        let any = self.down.iter().any(|a| !self.taken.contains(a));
        (self.rejoin.is_some() && any).then(|| self.next_look.saturating_duration_since(Instant::now()))
    }

    /// The down workers that accept a TCP connection now (each given [`LOOK_TIMEOUT`]);
    /// the next look is due after the current wait.
    pub fn look(&mut self) -> Vec<String> {
        self.next_look = Instant::now() + self.wait;
        self.down.iter().filter(|a| !self.taken.contains(a) && answers(a)).cloned().collect()
    }

    /// Take the workers `back` (down ones that answered [`Replanner::look`]) into the
    /// engine again: drop `old`, prepare over every worker not still down (a ring's solver
    /// re-plans over all of them). If that fails, the engine is set up as before without
    /// them and the next look waits twice as long; `None` if no engine can be set up.
    pub fn rejoin(&mut self, old: Context, back: &[String]) -> Option<Context> {
        drop(old);
        let names = back.join(", ");
        let before = std::mem::take(&mut self.down);
        self.down = before.iter().filter(|a| !back.contains(a)).cloned().collect();
        let opts = self.without_down();
        match hearth_engine::prepare(&self.model, &opts) {
            Ok(p) => {
                self.wait = self.rejoin.unwrap_or(MAX_REJOIN_WAIT);
                let members: Vec<String> = p.cluster.as_ref().map(|c| c.workers.clone()).unwrap_or_default();
                self.installed(opts, p.cluster.as_ref());
                let (joined, unused): (Vec<&String>, Vec<&String>) = back.iter().partition(|a| members.contains(a));
                if !joined.is_empty() {
                    self.with_state(|st| st.rejoins += 1);
                }
                let list = |v: &[&String]| v.iter().map(|a| a.as_str()).collect::<Vec<_>>().join(", ");
                let said = match (joined.is_empty(), unused.is_empty()) {
                    (false, true) => format!("{} answered again and rejoined", list(&joined)),
                    (false, false) => format!(
                        "{} answered again and rejoined; {} answered too, but the ring's solver gives it no layers",
                        list(&joined),
                        list(&unused)
                    ),
                    _ => format!("{names} answered again, but the ring's solver gives it no layers (unused)"),
                };
                eprintln!("hearth serve: {said}; serving on {}", self.serving_on());
                Some(p.ctx)
            }
            Err(e) => {
                self.down = before;
                self.wait = (self.wait * 2).min(MAX_REJOIN_WAIT);
                self.next_look = Instant::now() + self.wait;
                eprintln!(
                    "hearth serve: {names} answered again, but taking it in failed ({e:#}); going on without it, next look in {} s",
                    self.wait.as_secs()
                );
                let opts = self.without_down();
                self.prepare(opts, "setting the engine up again as it was")
            }
        }
    }

    /// Prepare an engine with `opts`; if that fails across devices, on this machine alone
    /// (every worker then counts as down). Updates `/health`'s state; `None` if no engine
    /// can be set up.
    fn prepare(&mut self, mut opts: EngineOptions, what: &str) -> Option<Context> {
        let prepared = match hearth_engine::prepare(&self.model, &opts) {
            Ok(p) => Ok(p),
            Err(e) if opts.cluster.is_some() => {
                eprintln!("hearth serve: {what} failed ({e:#}); going on with this machine alone");
                opts.cluster = None;
                let named = self.base.cluster.as_ref().map(|c| c.workers.clone()).unwrap_or_default();
                self.down = named;
                hearth_engine::prepare(&self.model, &opts)
            }
            Err(e) => Err(e),
        };
        match prepared {
            Ok(Prepared { ctx, cluster, .. }) => {
                self.installed(opts, cluster.as_ref());
                Some(ctx)
            }
            Err(e) => {
                eprintln!("hearth serve: cannot set the engine up again: {e:#}");
                self.with_state(|st| st.nodes.iter_mut().for_each(|n| n.up = false));
                None
            }
        }
    }

    /// An engine was prepared with `opts` over `cluster`: keep them, count a re-plan and
    /// show its devices in `/health`.
    fn installed(&mut self, opts: EngineOptions, cluster: Option<&hearth_engine::ClusterRun>) {
        let members: Vec<String> = cluster.map(|c| c.workers.clone()).unwrap_or_default();
        let layout = cluster.map_or("single", |c| c.layout());
        let down = self.down.clone();
        self.with_state(|st| {
            st.layout = layout;
            st.replans += 1;
            for n in st.nodes.iter_mut().skip(1) {
                n.up = members.contains(&n.addr);
                n.failed = !n.up && down.contains(&n.addr);
            }
        });
        self.opts = opts;
    }

    fn with_state(&self, f: impl FnOnce(&mut ClusterState)) {
        f(self.state.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(ClusterState::default))
    }

    /// `N device(s) (layout)` of the engine now.
    fn serving_on(&self) -> String {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let st = st.as_ref().map(|s| (s.nodes.iter().filter(|n| n.up).count(), s.layout)).unwrap_or((1, "single"));
        format!("{} device(s) ({})", st.0, st.1)
    }

    /// The first options without the workers in `down` (a ring loses its `--layer-window`
    /// when any is left out).
    fn without_down(&self) -> EngineOptions {
        let named = self.base.cluster.as_ref().map(|c| c.workers.clone()).unwrap_or_default();
        let mut o = self.base.clone();
        for (i, a) in named.iter().enumerate().rev() {
            if self.down.contains(a) {
                o = o.without_node(i + 1);
            }
        }
        o
    }
}

/// Whether `addr` (`HOST:PORT`) accepts a TCP connection within [`LOOK_TIMEOUT`]. (The
/// worker logs the closed connection as a port check.)
fn answers(addr: &str) -> bool {
    use std::net::ToSocketAddrs;
    addr.to_socket_addrs().map(|mut it| it.any(|a| std::net::TcpStream::connect_timeout(&a, LOOK_TIMEOUT).is_ok())).unwrap_or(false)
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
