//! What every call needs, in one place: the servers, the policy snapshot, the
//! registry (cache and change events), the audit sink, the input handlers and the
//! settings. Built once by the harness; reads here never go through a mailbox.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::audit::AuditSink;
use crate::permission::SharedPolicy;
use crate::registry::{Registry, RegistryRef};
use crate::server::{Directory, ServerRef};
use crate::transport::AskedDuring;

use super::catalog::Catalog;
use super::input::InputHandlers;
use super::settings::CallConfig;

/// Shared by every call of one harness.
pub struct CallContext {
    pub(crate) servers: Directory,
    pub(crate) policy: SharedPolicy,
    pub(crate) registry: Arc<Registry>,
    pub(crate) registry_ref: RegistryRef,
    pub(crate) audit: AuditSink,
    pub(crate) inputs: InputHandlers,
    pub(crate) settings: CallConfig,
    /// Which calls are traced.
    pub(crate) sampler: crate::util::trace_context::HeadSampler,
    pub(crate) catalog: Catalog,
    /// What calls did (durations, outcomes, rounds).
    pub(crate) metrics: Arc<super::metrics::CallMetrics>,
    pub(crate) progress: Arc<super::ProgressRouter>,
    /// Lists being refreshed ahead of their expiry (server, method, scope).
    pub(crate) refreshing: parking_lot::Mutex<std::collections::HashSet<String>>,
    /// First pages of lists being fetched, which walks that want the same list join.
    pub(crate) list_flights: super::listed::ListFlights,
    next_call: AtomicU64,
    in_flight: AtomicUsize,
    /// The calls on each server now (call id, agent): whose a legacy server's request
    /// is, when it comes during a call.
    on_servers: parking_lot::Mutex<foldhash::HashMap<String, Vec<CallOn>>>,
}

/// The questions (elicitation, sampling) legacy servers asked during one call, shared
/// by its attempts: counted against `round_cap` (failing over does not start the count
/// again) with the call's `input_required` rounds, and noted for its `finished` audit
/// record, up to one past the cap.
#[derive(Default)]
pub(crate) struct Questions {
    count: AtomicUsize,
    /// The call's `input_required` rounds so far (a delegation's from its caller): one
    /// cap for both, whichever era the servers it tries are of.
    rounds: AtomicUsize,
    noted: parking_lot::Mutex<Noted>,
}

#[derive(Default)]
struct Noted {
    questions: Vec<crate::audit::Question>,
    /// Taken for the record: what ends after goes nowhere.
    taken: bool,
}

/// How a question noted as asked and not yet ended is recorded.
const ASKED: &str = "asked";

impl Questions {
    /// A call's questions, after `rounds` rounds.
    pub(crate) fn after(rounds: usize) -> Questions {
        Questions {
            rounds: AtomicUsize::new(rounds),
            ..Questions::default()
        }
    }

    /// The questions asked so far.
    pub(crate) fn asked_so_far(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    /// The call has had `rounds` rounds.
    pub(crate) fn set_rounds(&self, rounds: usize) {
        self.rounds.store(rounds, Ordering::SeqCst);
    }

    /// Notes a question asked, within what the record keeps (`cap` + 1): its place,
    /// where how it ends is noted ([`Questions::ended`]).
    pub(crate) fn asked(&self, cap: usize, server: &str, method: &str) -> Option<usize> {
        let mut noted = self.noted.lock();
        if noted.taken || noted.questions.len() > cap {
            return None;
        }
        noted.questions.push(crate::audit::Question {
            server: server.to_string(),
            method: crate::util::text::one_line(method, 100),
            outcome: ASKED,
        });
        Some(noted.questions.len() - 1)
    }

    /// Notes how the question at `place` ended.
    pub(crate) fn ended(&self, place: usize, outcome: &'static str) {
        let mut noted = self.noted.lock();
        if !noted.taken
            && let Some(q) = noted.questions.get_mut(place)
        {
            q.outcome = outcome;
        }
    }

    /// What was noted, taken: a question still open is `unanswered` (its call ended
    /// first; another call on the server may still see it answered).
    pub(crate) fn take(&self) -> Vec<crate::audit::Question> {
        let mut noted = self.noted.lock();
        noted.taken = true;
        let mut questions = std::mem::take(&mut noted.questions);
        for q in &mut questions {
            if q.outcome == ASKED {
                q.outcome = "unanswered";
            }
        }
        questions
    }
}

/// Where a delegated call's caller answers its server's questions, and what it
/// declared it can answer: a legacy server's question is held to that, as a round's is.
#[derive(Clone)]
pub(crate) struct CallerAsks {
    pub(crate) to: tokio::sync::mpsc::Sender<super::ServerQuestion>,
    pub(crate) declared: Arc<serde_json::Value>,
}

/// A call on a server.
struct CallOn {
    call: u64,
    /// When the call ends at the latest (its deadline).
    deadline: std::time::Instant,
    agent: Option<Arc<str>>,
    /// What it calls there (a tool's or prompt's name, a resource's URI): a question
    /// asked during it is refused once its grant is revoked.
    item: Arc<str>,
    /// Where its caller answers the server's questions (delegated calls).
    questions: Option<CallerAsks>,
    /// Cancelled when the call's attempt there ends: a question the server asked
    /// during it is not answered for nobody. Made when a question is taken for this
    /// call's (most calls are asked nothing).
    ended: Option<tokio_util::sync::CancellationToken>,
    /// Questions servers asked during it.
    asked: Arc<Questions>,
}

/// Whose a request from a server is; see [`CallContext::on`]. "The calls" below are
/// the one it named, or every call on the server when it named none.
pub(crate) struct Whose {
    /// The agent of the calls, if they are all one agent's.
    pub(crate) agent: Option<String>,
    /// The call, if there is one only.
    pub(crate) call: Option<u64>,
    /// When that call ends at the latest.
    pub(crate) call_deadline: Option<std::time::Instant>,
    /// Whether it is no one agent's (calls of several, or a request of none).
    pub(crate) shared: bool,
    /// One token for each of the calls (and for the requests of no call on the server
    /// when it came), each cancelled when that one ends: when all are, whoever it was
    /// asked for is gone. Empty outside calls (never withdrawn so).
    pub(crate) ended: Vec<tokio_util::sync::CancellationToken>,
    /// Whether any call (or request of the harness's own) is on the server now.
    pub(crate) during_call: bool,
    /// Each call's agent and what it calls there: the question is no longer asked
    /// for anyone once none of them may (a grant revoked meanwhile). Empty for
    /// requests of no call.
    pub(crate) grants: Vec<(Option<Arc<str>>, Arc<str>)>,
    /// Each call's questions, where how this one ends is noted.
    pub(crate) asked: Vec<Arc<Questions>>,
    /// Where the caller of the one call answers its questions, if that call is
    /// delegated: taken with the rest, so that it is the call the rest describe.
    pub(crate) questions: Option<CallerAsks>,
}

/// Whose a server's request is when it is no call's: a request of the harness's own
/// while one is on the server (`unowned_end`: cancelled when the last ends), else no
/// one's, outside calls.
fn no_call(unowned_end: Option<tokio_util::sync::CancellationToken>) -> Whose {
    let unowned = unowned_end.is_some();
    Whose {
        agent: None,
        call: None,
        call_deadline: None,
        shared: unowned,
        ended: unowned_end.into_iter().collect(),
        during_call: unowned,
        grants: Vec::new(),
        asked: Vec::new(),
        questions: None,
    }
}

/// The calls on a server that a request of its may be whose: all of them, or only the
/// one it `named` (none once that one has ended).
fn whose_calls(calls: &mut [CallOn], named: Option<u64>) -> &mut [CallOn] {
    let Some(call) = named else {
        return calls;
    };
    match calls.iter().position(|c| c.call == call) {
        Some(at) => std::slice::from_mut(&mut calls[at]),
        None => &mut [],
    }
}

/// A call's attempt on a server, counted there until dropped.
pub(crate) struct OnServer<'a> {
    ctx: &'a CallContext,
    server: &'a str,
    call: u64,
}

impl Drop for OnServer<'_> {
    fn drop(&mut self) {
        let mut on = self.ctx.on_servers.lock();
        if let Some(calls) = on.get_mut(self.server) {
            if let Some(at) = calls.iter().position(|c| c.call == self.call)
                && let Some(ended) = calls.swap_remove(at).ended
            {
                ended.cancel();
            }
            if calls.is_empty() {
                on.remove(self.server);
            }
        }
    }
}

/// Counts a call as in flight until dropped.
pub(crate) struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl CallContext {
    /// The context of one harness.
    pub(crate) fn new(
        servers: Directory,
        policy: SharedPolicy,
        registry: Arc<Registry>,
        registry_ref: RegistryRef,
        audit: AuditSink,
        inputs: InputHandlers,
        settings: CallConfig,
    ) -> CallContext {
        CallContext {
            servers,
            policy,
            registry,
            registry_ref,
            audit,
            inputs,
            sampler: crate::util::trace_context::HeadSampler::new(settings.trace_sample_ratio),
            settings,
            catalog: Catalog::default(),
            metrics: Arc::default(),
            progress: Arc::default(),
            refreshing: parking_lot::Mutex::default(),
            list_flights: Default::default(),
            // Two harnesses writing one audit file (a restart, a gateway and a CLI
            // call) do not number their calls alike: a `started` left without its
            // `finished` by a crash is not closed by another run's call of the same id.
            next_call: AtomicU64::new(crate::util::random_start()),
            in_flight: AtomicUsize::new(0),
            on_servers: parking_lot::Mutex::default(),
        }
    }

    /// Notes call `call` of `agent` on `server` until the guard drops.
    pub(crate) fn on_server<'a>(
        &'a self,
        server: &'a str,
        (call, deadline): (u64, std::time::Instant),
        agent: Option<Arc<str>>,
        item: &str,
        questions: Option<CallerAsks>,
        asked: Arc<Questions>,
    ) -> OnServer<'a> {
        let on_server = CallOn {
            call,
            deadline,
            agent,
            item: item.into(),
            questions,
            ended: None,
            asked,
        };
        let mut on = self.on_servers.lock();
        // The key is allocated only when the server has no call on it yet.
        match on.get_mut(server) {
            Some(calls) => calls.push(on_server),
            None => {
                on.insert(server.to_string(), vec![on_server]);
            }
        }
        OnServer {
            ctx: self,
            server,
            call,
        }
    }

    /// Whose a request from `server` is, asked `during` one of ours as far as the
    /// transport shows. One named (legacy HTTP): that call's alone, or no call's. None
    /// named (stdio, a legacy session's own stream): the agent of every call on it now
    /// (if they are all one agent's), the call (if there is one only), and whether
    /// calls of several agents are on it (then it is no one agent's); a request of no
    /// call on it (an embedder's own; not a listing) counts as another agent's.
    pub(crate) fn on(&self, server: &str, during: AskedDuring) -> Whose {
        let named = match during {
            AskedDuring::Unknown => None,
            AskedDuring::Request { owner: Some(call) } => Some(call),
            AskedDuring::Request { owner: None } => {
                return no_call(
                    self.servers
                        .get(server)
                        .and_then(|s| s.unowned_requests_end()),
                );
            }
            AskedDuring::Ended => return no_call(None),
        };
        // Taken before the count is read: a request of no call that ends between the
        // two leaves a token already cancelled, not a question held for nobody.
        let unowned_end = match named {
            None => self
                .servers
                .get(server)
                .and_then(|s| s.unowned_requests_end()),
            Some(_) => None,
        };
        let unowned = unowned_end.is_some();
        let mut on = self.on_servers.lock();
        let calls = match on.get_mut(server) {
            Some(calls) => whose_calls(calls, named),
            None => &mut [],
        };
        if calls.is_empty() {
            // No call on it (or the one named has ended); a request of the harness's
            // own may be: its server's questions during it are no one agent's (no
            // agent's sampling pays for them), and are withdrawn when the last such
            // request ends.
            return no_call(unowned_end);
        }
        let grants = calls
            .iter()
            .map(|c| (c.agent.clone(), c.item.clone()))
            .collect();
        let asked = calls.iter().map(|c| c.asked.clone()).collect();
        // Withdrawn once every call on the server now (and the requests of no call)
        // has ended: it was one of theirs.
        let mut ended: Vec<_> = calls
            .iter_mut()
            .map(|c| {
                c.ended
                    .get_or_insert_with(tokio_util::sync::CancellationToken::new)
                    .clone()
            })
            .collect();
        if unowned {
            ended.extend(unowned_end);
            // The requests of no call may be whose it is: not refused for the calls'
            // grants.
            return Whose {
                agent: None,
                call: None,
                call_deadline: None,
                shared: true,
                ended,
                during_call: true,
                grants: Vec::new(),
                asked,
                questions: None,
            };
        }
        let (agent, shared) = match calls.first() {
            Some(first) if calls.iter().all(|c| c.agent == first.agent) => {
                (first.agent.as_deref().map(String::from), false)
            }
            _ => (None, true),
        };
        // The call named, or a guess: the one call on the server now.
        let (call, call_deadline, questions) = match &*calls {
            [one] => (Some(one.call), Some(one.deadline), one.questions.clone()),
            _ => (None, None, None),
        };
        Whose {
            agent,
            call,
            call_deadline,
            shared,
            ended,
            during_call: !calls.is_empty(),
            grants,
            asked,
            questions,
        }
    }

    /// Whether one of `grants` (see [`Whose::grants`]) is still in force on `server`;
    /// true for none (a request of no call).
    pub(crate) fn still_granted(
        &self,
        server: &str,
        grants: &[(Option<Arc<str>>, Arc<str>)],
    ) -> bool {
        if grants.is_empty() {
            return true;
        }
        let Some(server) = self.servers.get(server) else {
            return false;
        };
        grants
            .iter()
            .any(|(agent, item)| self.allows(agent.as_deref(), &server, item))
    }

    /// Counts a question (elicitation, sampling) that `server` asks during the calls on
    /// it now, against each of them (with what servers they tried before asked); false
    /// once every one of them was asked more than `round_cap`: a legacy server that
    /// keeps asking is refused, as a modern one is past its rounds, instead of asking a
    /// person again until the deadline. True outside calls (the policy for those
    /// applies).
    pub(crate) fn count_question(&self, server: &str, during: AskedDuring) -> bool {
        let named = match during {
            AskedDuring::Unknown => None,
            AskedDuring::Request { owner: Some(call) } => Some(call),
            AskedDuring::Request { owner: None } | AskedDuring::Ended => return true,
        };
        // Requests of no call on it count as another agent's, as in `on`.
        let unowned =
            named.is_none() && (self.servers.get(server)).is_some_and(|s| s.has_unowned_requests());
        let mut on = self.on_servers.lock();
        let Some(calls) = on.get_mut(server) else {
            return true;
        };
        let calls = whose_calls(calls, named);
        if calls.is_empty() {
            return true;
        }
        let (mut least, mut most) = (usize::MAX, 0);
        for call in calls.iter() {
            let asked = call
                .asked
                .count
                .fetch_add(1, Ordering::SeqCst)
                .saturating_add(1)
                .saturating_add(call.asked.rounds.load(Ordering::SeqCst));
            least = least.min(asked);
            most = most.max(asked);
        }
        // All one agent's: past the cap once any of them is, or a stream of short
        // calls beside a long one would keep the least under it for ever. Several
        // agents' (whose question it is is unknown): once every one is.
        let one_agent = !unowned
            && calls
                .first()
                .is_some_and(|first| calls.iter().all(|c| c.agent == first.agent));
        match one_agent {
            true => most <= self.settings.round_cap,
            false => least <= self.settings.round_cap,
        }
    }

    /// Counts one call in flight until the guard drops.
    pub(crate) fn enter(&self) -> InFlight<'_> {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(&self.in_flight)
    }

    /// Calls between their `started` and `finished` records now.
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// A fresh call id: unique within this harness, and (numbered from a random start)
    /// across the harnesses that append to one audit file, with overwhelming likelihood.
    pub(crate) fn next_call_id(&self) -> u64 {
        self.next_call.fetch_add(1, Ordering::Relaxed)
    }

    /// Whether `agent` may call `tool` on `server`, per the grants now.
    pub(crate) fn allows(&self, agent: Option<&str>, server: &ServerRef, tool: &str) -> bool {
        let config = server.config();
        self.policy
            .read()
            .allows(agent, &config.id, &config.tags, tool)
    }

    /// Whether `agent` may use anything on `server`.
    pub(crate) fn allows_any(&self, agent: Option<&str>, server: &ServerRef) -> bool {
        let config = server.config();
        self.policy
            .read()
            .allows_any(agent, &config.id, &config.tags)
    }
}
