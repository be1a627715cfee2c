//! A legacy server's own elicitation during a 2026-07-28 client's call, served as an
//! `input_required` round: the upstream call cannot be ended and started again (a
//! legacy server holds the call open while it waits for its answer), so it is held
//! here, "parked", while the downstream client is asked; its retry, carrying the
//! answer and the sealed `requestState` that names the parked round, takes it up again.
//!
//! A parked round lives in the process that parked it: another gateway process cannot
//! continue it (its `requestState` is refused there as any unknown state). It is
//! dropped, and the upstream call cancelled, when its state expires (`state_ttl`), or
//! to make room for another principal's when [`MAX_PARKED`] are parked and its
//! principal holds the most (see [`super::fair`]), or for a newer one of its own
//! principal past [`MAX_PARKED_PER_PRINCIPAL`], or when the `serve --stdio` session
//! it came in on ends.

use std::collections::HashMap;
use std::time::Instant;

use parking_lot::Mutex;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::Principal;
use crate::call::{Answer, CancelToken, ServerQuestion};
use crate::protocol::RpcError;
use crate::protocol::error::INTERNAL_ERROR;

/// The key of the question in the downstream `inputRequests`.
pub const KEY: &str = "elicitation";
/// Parked rounds held at most (all principals).
pub const MAX_PARKED: usize = 1024;
/// Parked rounds one principal may hold: one agent cannot take every slot.
pub const MAX_PARKED_PER_PRINCIPAL: usize = 16;

/// The upstream call's future, polled by the request that started it; it becomes a task
/// of its own only when it parks (a spawn per call cost a copy of the call's future and
/// a task hand-off on every call, for the rare call that parks).
pub enum Call {
    /// Polled where it is awaited.
    Inline(std::pin::Pin<Box<dyn Future<Output = Result<Answer, RpcError>> + Send>>),
    /// Running on its own, while no request waits on it.
    Spawned(JoinHandle<Result<Answer, RpcError>>),
    /// Finished while its round was parked: its outcome, for the answer that takes the
    /// round up (the tool ran; its result is not thrown away).
    Finished(Option<Result<Answer, RpcError>>),
}

impl Call {
    /// A call polled by whoever awaits it. A panic in it ends the call with an error,
    /// as it did when every call was a task of its own, not the request that polls it.
    pub fn inline(call: impl Future<Output = Result<Answer, RpcError>> + Send + 'static) -> Call {
        use futures_util::FutureExt;
        let contained = std::panic::AssertUnwindSafe(call)
            .catch_unwind()
            .map(|done| done.unwrap_or_else(|_| Err(ended())));
        Call::Inline(Box::pin(contained))
    }

    /// Lets the call go on with nobody awaiting it; a call already on its own (parked
    /// before, in an earlier round) stays as it is.
    fn detach(&mut self) {
        if let Call::Inline(call) = self {
            let call = std::mem::replace(call, Box::pin(std::future::pending()));
            *self = Call::Spawned(tokio::spawn(call));
        }
    }
}

impl Future for Call {
    type Output = Result<Answer, RpcError>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        match self.get_mut() {
            Call::Inline(call) => call.as_mut().poll(cx),
            Call::Spawned(task) => std::pin::Pin::new(task)
                .poll(cx)
                .map(|done| done.unwrap_or_else(|_| Err(ended()))),
            Call::Finished(done) => {
                std::task::Poll::Ready(done.take().unwrap_or_else(|| Err(ended())))
            }
        }
    }
}

/// What the answer to a round whose call ended while it waited is told, when the
/// call's outcome was too large to keep for it.
const CALL_ENDED: &str = "the input round's call ended before the answer came (its server stopped waiting), with an outcome too large to keep for it";

/// The largest outcome (as JSON) of a call that finished while its round was parked
/// that is kept for the answer: its round holds it until its state expires.
const KEPT_OUTCOME_BYTES: usize = 1 << 20;

/// What a second answer to a legacy server's question is told: its call went on with
/// the first, and is answered to the request that took it up (a round held in this
/// process is taken up once; a sealed round of a modern server may be sent again).
const ANSWERED: &str =
    "invalid requestState: the input round was already answered; its call went on with that answer";

/// What the answer to a round dropped for a newer one of its principal is told.
const REPLACED: &str = "the input round was dropped for a newer one of the same agent";

/// What the answer to a round dropped to make room for another agent's is told.
const FREED: &str = "the input round was dropped to make room for another agent's";

/// What a second answer to a round is told when the request that took it up went
/// before its call answered (the call was cancelled with it).
const CANCELLED: &str = "the input round was answered, and its call then cancelled: the request that took it up went before the call answered";

/// A call that panicked or whose task was lost.
fn ended() -> RpcError {
    RpcError::new(INTERNAL_ERROR, "the call ended unexpectedly")
}

/// An upstream call in flight on behalf of a downstream client: the call, the
/// questions its server asks, and the token that ends it (cancelled when this drops).
pub struct Held {
    pub call: Call,
    pub questions: Option<mpsc::Receiver<ServerQuestion>>,
    pub cancel: CancelToken,
    /// Where the call's progress goes now: the waiting request's sender and token.
    pub progress: ProgressSlot,
    /// The task relaying the call's progress (it ends with the call).
    pub relay: Option<JoinHandle<()>>,
}

impl Held {
    /// Waits until the progress the finished call sent has been passed on, so that it
    /// reaches the client before the result.
    pub async fn drain(mut self) {
        if let Some(relay) = self.relay.take() {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), relay).await;
        }
    }
}

/// The progress destination of a held call, swapped as requests take it up.
pub type ProgressSlot = std::sync::Arc<Mutex<Option<(crate::call::ProgressSender, Value)>>>;

impl Drop for Held {
    fn drop(&mut self) {
        // Whoever let go of the call ends it (finished calls ignore it), and its
        // progress goes nowhere (a waiting request's stream is not held open).
        self.cancel.cancel();
        *self.progress.lock() = None;
    }
}

/// How waiting on a held call ended.
pub enum Waited {
    /// The call finished (its hold is handed back, to drain its progress).
    Done(Result<Answer, RpcError>, Held),
    /// Its server asked a question first.
    Asked(Held, ServerQuestion),
}

/// Waits until the call finishes or its server asks something.
pub async fn wait(mut held: Held) -> Waited {
    loop {
        let question = async {
            match held.questions.as_mut() {
                Some(rx) => rx.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            // A call that is done is done, whatever it asked last.
            biased;
            done = &mut held.call => return Waited::Done(done, held),
            asked = question => match asked {
                Some(q) => return Waited::Asked(held, q),
                // No more questions can come: only the call is left.
                None => held.questions = None,
            },
        }
    }
}

/// One parked round.
struct Parked {
    principal: Principal,
    /// The local session that parked it, whose end drops it (`None`: over HTTP).
    session: Option<u64>,
    /// What the call is of on its server (the question's): a tool's or prompt's name,
    /// a resource's URI; a reload that takes the grant to it away ends the round.
    item: String,
    /// The size of the call's params (as JSON), which the parked call holds parsed.
    bytes: usize,
    held: Held,
    /// Its call ended with an outcome it could not keep: the answer is told so.
    outcome_let_go: bool,
    /// The server that asked, and where its question's answer goes (the question's
    /// params went to the client and are not held here).
    server: String,
    reply: tokio::sync::oneshot::Sender<Result<Value, RpcError>>,
    expires: Instant,
    /// When it was parked (its state issued): a reload that shortens `state_ttl`
    /// shortens its life too ([`ParkedRounds::sweep`]).
    issued: Instant,
    /// The id of the key its state was sealed under, once sealed
    /// ([`ParkedRounds::sealed_under`]): a reload that drops the key ends the round.
    key: Option<String>,
}

impl Parked {
    /// Whether its call has ended while it waited (its server stopped waiting for the
    /// answer and answered the call, or went away) and its outcome was not kept.
    fn call_ended(&self) -> bool {
        matches!(&self.held.call, Call::Spawned(task) if task.is_finished())
    }

    /// Keeps the outcome of a call that finished while it waited, for the answer that
    /// takes the round up, counted in the round's bytes; false when it is too large to
    /// keep ([`KEPT_OUTCOME_BYTES`]) or `room` (given the principal and the size) says
    /// it does not fit the parked rounds' budgets, and the round goes (its outcome
    /// dropped with it, outside the lock).
    fn keep_outcome(&mut self, room: &mut impl FnMut(&Principal, usize) -> bool) -> bool {
        use crate::registry::cache::json_size_within;
        use futures_util::FutureExt;
        if !self.call_ended() {
            return true;
        }
        let Some(done) = (&mut self.held.call).now_or_never() else {
            return true;
        };
        let size = match &done {
            Ok(answer) => json_size_within(&answer.result, KEPT_OUTCOME_BYTES),
            Err(e) => e
                .data
                .as_ref()
                .map_or(Some(0), |d| json_size_within(d, KEPT_OUTCOME_BYTES))
                .map(|n| n.saturating_add(e.message.len())),
        };
        self.held.call = Call::Finished(Some(done));
        match size {
            Some(size) if size <= KEPT_OUTCOME_BYTES && room(&self.principal, size) => {
                self.bytes = self.bytes.saturating_add(size);
                true
            }
            _ => {
                self.outcome_let_go = true;
                false
            }
        }
    }
}

/// Held by the request that took a parked round up, until its call answers or asks
/// again. Dropped before that (the request cancelled, its client gone, its future
/// dropped: the call is cancelled with it), a later answer to the round is told the
/// call was cancelled, not that it went on.
pub struct TakenUp<'a> {
    rounds: &'a ParkedRounds,
    id: Option<String>,
}

impl TakenUp<'_> {
    /// The call answered or asked again: it went on with the answer.
    pub fn settled(&mut self) {
        self.id = None;
    }
}

impl Drop for TakenUp<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.rounds.note_cancelled(&id);
        }
    }
}

/// The rounds parked in this process.
pub struct ParkedRounds {
    rounds: Mutex<HashMap<String, Parked>>,
    /// Rounds dropped because their call ended while parked, or for a newer round of
    /// their principal, until their state would have expired (at most [`MAX_PARKED`]):
    /// the answer that comes later is told why, not "invalid requestState".
    ended: Mutex<HashMap<String, (Principal, Instant, &'static str)>>,
    /// Rounds held at most, all principals' ([`MAX_PARKED`]).
    max: usize,
    /// Rounds one principal may hold ([`MAX_PARKED_PER_PRINCIPAL`]).
    per_principal: usize,
    /// The byte budgets of one principal's parked calls and of all principals', as
    /// the last round parked was given them (the settings in force then).
    budgets: Mutex<(usize, usize)>,
    /// Set at shutdown ([`ParkedRounds::close`]): no round is parked after it, as
    /// nobody could take it up and its call would hold the shutdown for its grace.
    closed: std::sync::atomic::AtomicBool,
    /// `serve --stdio` sessions whose input has ended ([`ParkedRounds::drop_session`]),
    /// until they are over ([`ParkedRounds::forget_session`]): a round of theirs is
    /// refused, as nobody could take it up.
    sessions_over: Mutex<std::collections::HashSet<u64>>,
}

impl Default for ParkedRounds {
    fn default() -> Self {
        ParkedRounds::with_caps(MAX_PARKED, MAX_PARKED_PER_PRINCIPAL)
    }
}

impl ParkedRounds {
    fn with_caps(max: usize, per_principal: usize) -> ParkedRounds {
        ParkedRounds {
            rounds: Mutex::default(),
            ended: Mutex::default(),
            max,
            per_principal,
            budgets: Mutex::new((usize::MAX, usize::MAX)),
            closed: Default::default(),
            sessions_over: Default::default(),
        }
    }

    /// Parks `held` with its unanswered question until `expires`, for `principal`
    /// (and the local session it came in on, if any); the id its sealed state names,
    /// or `None` when no place can be made (the question is then refused and the call
    /// let go). A principal holding its share (in places or in bytes) gives up its own
    /// rounds that expire first on the same channel (`session`), and is refused when
    /// those are not enough (another session's person may be answering the rest). When all places are taken, the principal holding the
    /// most gives up its round that expires first, if it holds at least two more than
    /// this one.
    /// `size`: the call's params' size, the most its principal's parked
    /// calls may hold (one is parked whatever its size), and the most all principals'
    /// may (a bound on every one): parked for minutes, parsed params take many times
    /// their size, so parked large calls are held to a budget of their own, apart from
    /// the calls in flight (whose budget the answers need).
    pub fn park(
        &self,
        (principal, session): (&Principal, Option<u64>),
        item: String,
        (params_bytes, budget, budget_all): (usize, usize, usize),
        mut held: Held,
        pending: ServerQuestion,
        expires: Instant,
    ) -> Option<String> {
        let ServerQuestion { server, reply, .. } = pending;
        *self.budgets.lock() = (budget, budget_all);
        let mut rounds = self.rounds.lock();
        // Under the lock `close` empties: a round is parked before it (and dropped by
        // it) or refused.
        if self.closed.load(std::sync::atomic::Ordering::Acquire) {
            drop(rounds);
            let _ = reply.send(Err(RpcError::new(
                INTERNAL_ERROR,
                "the gateway is shutting down",
            )));
            return None;
        }
        if session.is_some_and(|s| self.sessions_over.lock().contains(&s)) {
            drop(rounds);
            let _ = reply.send(Err(RpcError::new(
                INTERNAL_ERROR,
                "the client's input has ended",
            )));
            return None;
        }
        let now = Instant::now();
        // Expired rounds go (their calls are cancelled as they drop, after the lock:
        // an outcome kept may be a MiB), and those whose calls ended with an outcome
        // too large to keep.
        let finished = self.drop_finished(&mut rounds, now, |_, _, _, _| true);
        // A principal at its share gives up its own rounds that expire first: a client
        // that stops retrying (its person declined) leaves rounds behind, and is not
        // locked out until they expire.
        // Only those of the same channel (its `serve --stdio` session, or HTTP): another
        // session's person may be answering its round right now.
        let (mut by_principal, mut their_bytes) = rounds
            .values()
            .filter(|p| &p.principal == principal)
            .fold((0usize, 0usize), |(n, b), p| {
                (n + 1, b.saturating_add(p.bytes))
            });
        let mut own: Vec<(&String, Instant, usize)> = rounds
            .iter()
            .filter(|(_, p)| &p.principal == principal && p.session == session)
            .map(|(id, p)| (id, p.expires, p.bytes))
            .collect();
        own.sort_by_key(|(_, at, _)| *at);
        let over = |n: usize, bytes: usize| {
            n >= self.per_principal || (n > 0 && bytes.saturating_add(params_bytes) > budget)
        };
        let mut own_going = Vec::new();
        for (id, _, bytes) in &own {
            if !over(by_principal, their_bytes) {
                break;
            }
            own_going.push((*id).clone());
            by_principal -= 1;
            their_bytes = their_bytes.saturating_sub(*bytes);
        }
        let all_bytes = rounds
            .iter()
            .filter(|(id, _)| !own_going.contains(id))
            .fold(0usize, |b, (_, p)| b.saturating_add(p.bytes));
        // The id first: a round that cannot be parked takes no place from another.
        let mut bytes = [0u8; 16];
        let (mut freed, mut own_freed) = (Vec::new(), Vec::new());
        let refused = if by_principal >= self.per_principal {
            Some("too many input rounds are held")
        } else if over(by_principal, their_bytes) {
            Some("too many large input rounds are held")
        } else if getrandom::fill(&mut bytes).is_err() {
            Some("no randomness for a round id")
        } else {
            // Room, in places and in bytes: the principal holding the most gives up its
            // round that expires first, while it holds at least two more than this
            // one. Worked out before any round goes, so that none goes for nothing.
            let mut left: Vec<(&String, &Principal, Instant, usize)> = rounds
                .iter()
                .filter(|(id, _)| !own_going.contains(id))
                .map(|(id, p)| (id, &p.principal, p.expires, p.bytes))
                .collect();
            let mut all = all_bytes;
            let mut going = Vec::new();
            while left.len() >= self.max || all.saturating_add(params_bytes) > budget_all {
                let places = left.iter().map(|(id, who, at, _)| (*id, *who, *at));
                let Some(id) = super::fair::place_to_free(places, principal) else {
                    break;
                };
                if let Some(i) = left.iter().position(|(other, ..)| *other == id) {
                    let (id, _, _, bytes) = left.swap_remove(i);
                    all = all.saturating_sub(bytes);
                    going.push(id.clone());
                }
            }
            if left.len() >= self.max {
                Some("too many input rounds are held")
            } else if all.saturating_add(params_bytes) > budget_all {
                Some("too many large input rounds are held")
            } else {
                own_freed = own_going
                    .iter()
                    .filter_map(|id| rounds.remove(id).map(|p| (id.clone(), p)))
                    .collect();
                freed = going
                    .iter()
                    .filter_map(|id| rounds.remove(id).map(|p| (id.clone(), p)))
                    .collect();
                None
            }
        };
        if let Some(why) = refused {
            drop(rounds);
            drop(finished);
            let _ = reply.send(Err(RpcError::new(INTERNAL_ERROR, why)));
            return None;
        }
        let id: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        // Nobody awaits a parked call: it waits for its answer on its own.
        held.call.detach();
        rounds.insert(
            id.clone(),
            Parked {
                principal: principal.clone(),
                session,
                item,
                bytes: params_bytes,
                held,
                outcome_let_go: false,
                server,
                reply,
                expires,
                issued: now,
                key: None,
            },
        );
        drop(rounds);
        drop(finished);
        for (id, gone) in own_freed {
            tracing::debug!(agent = %gone.principal.agent, "a parked input round was dropped for a newer one of the same agent");
            self.note_ended(id, &gone, now, REPLACED);
            let _ = gone
                .reply
                .send(Err(RpcError::new(INTERNAL_ERROR, REPLACED)));
        }
        for (id, gone) in freed {
            tracing::info!(agent = %gone.principal.agent, "a parked input round was dropped to make room for another agent's");
            self.note_ended(id, &gone, now, FREED);
            // Its call is cancelled as it drops, and the question it waited on fails.
            let _ = gone.reply.send(Err(RpcError::new(INTERNAL_ERROR, FREED)));
        }
        Some(id)
    }

    /// Takes up parked round `id` of `principal`, on the channel that parked it (the
    /// local `session`, or `None`: HTTP): answers its question with `answer` and hands
    /// back the call (or its outcome, if it ended while it waited). No such round
    /// (expired, another process's, another principal's or channel's) is an invalid
    /// state; one whose call ended with an outcome too large to keep says so.
    pub fn resume(
        &self,
        id: &str,
        (principal, session): (&Principal, Option<u64>),
        answer: Value,
    ) -> Result<Held, RpcError> {
        let (parked, finished) = {
            let mut rounds = self.rounds.lock();
            let now = Instant::now();
            // Dropped after the lock, as in `park`.
            let finished = self.drop_finished(&mut rounds, now, |_, _, _, _| true);
            let parked = match rounds.get(id) {
                Some(p) if &p.principal == principal && p.session == session && p.expires > now => {
                    let taken = rounds.remove(id);
                    if let Some(p) = &taken {
                        self.note_ended(id.to_string(), p, now, ANSWERED);
                    }
                    taken
                }
                _ => None,
            };
            (parked, finished)
        };
        drop(finished);
        let Some(parked) = parked else {
            let ended = self.ended.lock();
            return Err(match ended.get(id) {
                // A state used up is an invalid one, as the spec says; the others ended
                // for reasons of the gateway's.
                Some((who, until, why)) if who == principal && *until > Instant::now() => {
                    let code = match *why == ANSWERED {
                        true => crate::protocol::error::INVALID_PARAMS,
                        false => INTERNAL_ERROR,
                    };
                    RpcError::new(code, *why)
                }
                _ => RpcError::new(
                    crate::protocol::error::INVALID_PARAMS,
                    "invalid requestState",
                ),
            });
        };
        let _ = parked.reply.send(Ok(answer));
        Ok(parked.held)
    }

    /// Drops the rounds past their expiry, those whose call ended, and those `keep`
    /// refuses (given the principal, the server and the item the call is of, and the
    /// key its state was sealed under): their calls are cancelled (outside the lock, as
    /// cancelling does work).
    ///
    /// A round is held to `ttl`, the states' lifetime in force, from when it was parked:
    /// a reload that shortened it made its state one the gateway refuses, and the
    /// round, which no one could take up, kept its place and its call until its old
    /// expiry.
    pub fn sweep(
        &self,
        ttl: std::time::Duration,
        keep: impl Fn(&Principal, &str, &str, Option<&str>) -> bool,
    ) {
        let now = Instant::now();
        let mut rounds = self.rounds.lock();
        for p in rounds.values_mut() {
            p.expires = p.expires.min(crate::util::duration::after(p.issued, ttl));
        }
        let dropped = self.drop_finished(&mut rounds, now, keep);
        drop(rounds);
        drop(dropped);
    }

    /// Takes out of `rounds` those past their expiry, those whose call ended with an
    /// outcome too large to keep (noted in `ended`) and those `keep` refuses; returns
    /// them, to drop outside the lock. A call that ended with an outcome it can keep
    /// stays, holding it.
    fn drop_finished(
        &self,
        rounds: &mut HashMap<String, Parked>,
        now: Instant,
        keep: impl Fn(&Principal, &str, &str, Option<&str>) -> bool,
    ) -> Vec<Parked> {
        let mut dropped = Vec::new();
        // An outcome kept counts against its principal's budget and all principals',
        // as the parked calls' params do when they park.
        let (budget, budget_all) = *self.budgets.lock();
        let mut all = 0usize;
        let mut by_principal: HashMap<Principal, usize> = HashMap::new();
        for p in rounds.values() {
            all = all.saturating_add(p.bytes);
            let theirs = by_principal.entry(p.principal.clone()).or_default();
            *theirs = theirs.saturating_add(p.bytes);
        }
        let mut room = |who: &Principal, size: usize| {
            let theirs = by_principal.entry(who.clone()).or_default();
            let fits =
                theirs.saturating_add(size) <= budget && all.saturating_add(size) <= budget_all;
            if fits {
                *theirs = theirs.saturating_add(size);
                all = all.saturating_add(size);
            }
            fits
        };
        for (id, p) in rounds.extract_if(|_, p| {
            p.expires <= now
                || !p.keep_outcome(&mut room)
                || !keep(&p.principal, &p.server, &p.item, p.key.as_deref())
        }) {
            if p.expires > now && (p.call_ended() || p.outcome_let_go) {
                self.note_ended(id, &p, now, CALL_ENDED);
            }
            dropped.push(p);
        }
        dropped
    }

    /// Marks round `id` as taken up by the request that holds the guard, until its call
    /// answers or asks again ([`TakenUp::settled`]).
    pub fn taken_up(&self, id: String) -> TakenUp<'_> {
        TakenUp {
            rounds: self,
            id: Some(id),
        }
    }

    /// Round `id`, taken up, had its call cancelled with the request that took it up
    /// (before the call answered): a later answer to it is told so, not that the call
    /// went on.
    fn note_cancelled(&self, id: &str) {
        if let Some((_, _, why)) = self.ended.lock().get_mut(id)
            && *why == ANSWERED
        {
            *why = CANCELLED;
        }
    }

    /// Notes round `id`, dropped before its state expired, so that its answer is told
    /// `why` rather than "invalid requestState".
    fn note_ended(&self, id: String, p: &Parked, now: Instant, why: &'static str) {
        let mut ended = self.ended.lock();
        ended.retain(|_, (_, until, _)| *until > now);
        // Full: a note of the principal that holds the most makes room, the one that
        // would go first (one principal's rounds must not push out another's notes,
        // whose retries would be told "invalid requestState" and run the call again);
        // about even, the newcomer's own, else the first to go of all.
        if ended.len() >= self.max {
            let held = ended.iter().map(|(id, (who, until, _))| (id, who, *until));
            let first_of = |whose: Option<&Principal>| {
                ended
                    .iter()
                    .filter(|(_, (who, _, _))| whose.is_none_or(|w| w == who))
                    .min_by_key(|(_, (_, until, _))| *until)
                    .map(|(id, _)| id)
            };
            let gone = super::fair::place_to_free(held, &p.principal)
                .or_else(|| first_of(Some(&p.principal)))
                .or_else(|| first_of(None))
                .cloned();
            if let Some(gone) = gone {
                ended.remove(&gone);
            }
        }
        ended.insert(id, (p.principal.clone(), p.expires, why));
    }

    /// Drops the rounds local session `session` parked (it ended): their calls are
    /// cancelled.
    pub fn drop_session(&self, session: u64) {
        let mut rounds = self.rounds.lock();
        // Under the lock `park` checks it with: a round is dropped here or refused.
        self.sessions_over.lock().insert(session);
        let dropped: Vec<Parked> = rounds
            .extract_if(|_, p| p.session == Some(session))
            .map(|(_, p)| p)
            .collect();
        drop(rounds);
        drop(dropped);
    }

    /// Forgets `session`, over (none of its requests runs any more).
    pub fn forget_session(&self, session: u64) {
        self.sessions_over.lock().remove(&session);
    }

    /// Notes the key the state of round `id` was sealed under.
    pub fn sealed_under(&self, id: &str, key: &str) {
        if let Some(p) = self.rounds.lock().get_mut(id) {
            p.key = Some(key.to_string());
        }
    }

    /// Drops round `id`, parked moments ago, whose state could not be sealed: its call
    /// is cancelled.
    pub fn discard(&self, id: &str) {
        let gone = self.rounds.lock().remove(id);
        drop(gone);
    }

    /// Drops every parked round (shutdown): their calls are cancelled, and rounds
    /// that come later are refused (their questions fail, and their calls end).
    pub fn close(&self) {
        let mut rounds = self.rounds.lock();
        self.closed
            .store(true, std::sync::atomic::Ordering::Release);
        // Dropped outside the lock: each cancels its call.
        let dropped = std::mem::take(&mut *rounds);
        drop(rounds);
        drop(dropped);
        self.ended.lock().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::super::fair::agent;
    use super::*;
    use tokio::sync::oneshot;

    /// A parked round's call (it waits forever), its question, and where the
    /// question's answer arrives.
    type Round = (
        Held,
        ServerQuestion,
        oneshot::Receiver<Result<Value, RpcError>>,
    );

    /// Parks a round of `a`'s, over HTTP, small, expiring in ten minutes.
    fn park_for(
        rounds: &ParkedRounds,
        a: &Principal,
        held: Held,
        question: ServerQuestion,
    ) -> Option<String> {
        let later = Instant::now() + std::time::Duration::from_secs(600);
        rounds.park(
            (a, None),
            "t".into(),
            (0, usize::MAX, usize::MAX),
            held,
            question,
            later,
        )
    }

    fn round() -> Round {
        let (reply, answer) = oneshot::channel();
        let held = Held {
            call: Call::inline(std::future::pending()),
            questions: None,
            cancel: CancelToken::new(),
            progress: ProgressSlot::default(),
            relay: None,
        };
        let question = ServerQuestion {
            server: "s".into(),
            method: "elicitation/create".into(),
            params: Value::Null,
            reply,
        };
        (held, question, answer)
    }

    // At shutdown the rounds go, and a call that asks later is not parked (nobody could
    // take the round up, and its call would hold the shutdown for its grace): its
    // question fails at once, and its call is dropped.
    #[tokio::test]
    async fn no_round_is_parked_once_closed() {
        let rounds = ParkedRounds::with_caps(64, 4);
        let a = agent("a");
        let park = |held: Held, question| park_for(&rounds, &a, held, question);
        let (held, question, _answer) = round();
        let cancel = held.cancel.clone();
        park(held, question).expect("parked");
        rounds.close();
        assert!(cancel.is_cancelled(), "a parked round's call is cancelled");
        let (held, question, answer) = round();
        let cancel = held.cancel.clone();
        assert!(park(held, question).is_none());
        let refused = answer.await.expect("answered");
        assert!(
            refused.is_err_and(|e| e.message.contains("shutting down")),
            "the question fails"
        );
        assert!(cancel.is_cancelled(), "its call is dropped");
        assert!(rounds.rounds.lock().is_empty());
    }

    // A `serve --stdio` session whose input has ended parks no more rounds (nobody
    // could take them up, and its client would be told of a round it cannot answer);
    // other sessions still do, and so does a new session once the ended one is over.
    #[tokio::test]
    async fn no_round_is_parked_for_a_session_whose_input_ended() {
        let rounds = ParkedRounds::with_caps(64, 4);
        let a = agent("a");
        let later = Instant::now() + std::time::Duration::from_secs(600);
        let park = |session: u64, held: Held, question| {
            rounds.park(
                (&a, Some(session)),
                "t".into(),
                (0, usize::MAX, usize::MAX),
                held,
                question,
                later,
            )
        };
        let (held, question, _answer) = round();
        let cancel = held.cancel.clone();
        park(1, held, question).expect("parked");
        rounds.drop_session(1);
        assert!(
            cancel.is_cancelled(),
            "its parked round's call is cancelled"
        );
        let (held, question, answer) = round();
        let cancel = held.cancel.clone();
        assert!(
            park(1, held, question).is_none(),
            "parked after its input ended"
        );
        let refused = answer.await.expect("answered");
        assert!(
            refused.is_err_and(|e| e.message.contains("input has ended")),
            "the question fails"
        );
        assert!(cancel.is_cancelled(), "its call is dropped");
        let (held, question, _other) = round();
        park(2, held, question).expect("another session parks");
        rounds.forget_session(1);
        assert!(
            rounds.sessions_over.lock().is_empty(),
            "forgotten once over"
        );
    }

    #[tokio::test]
    async fn a_call_that_ends_while_parked_hands_its_outcome_to_the_answer() {
        let rounds = ParkedRounds::with_caps(64, 4);
        let a = agent("a");
        let park = |held: Held, question| park_for(&rounds, &a, held, question);
        // Its server stopped waiting for the answer and answered the call: the tool
        // ran, and the answer that comes later gets its result.
        let (mut held, question, _answer) = round();
        held.call = Call::inline(async {
            Ok(Answer {
                result: serde_json::json!({"content": [{"type": "text", "text": "done"}]}),
                server: "s".into(),
                input_required: false,
                rounds: 1,
                server_identity: None,
            })
        });
        let small = park(held, question).expect("parked");
        // One too large to keep (over 1 MiB) is let go, and its place with it.
        let (mut held, question, _answer) = round();
        held.call = Call::inline(async {
            Err(RpcError::new(
                INTERNAL_ERROR,
                "x".repeat(KEPT_OUTCOME_BYTES + 1),
            ))
        });
        let large = park(held, question).expect("parked");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        rounds.sweep(std::time::Duration::MAX, |_, _, _, _| true);
        let held: Vec<String> = rounds.rounds.lock().keys().cloned().collect();
        assert_eq!(
            held,
            std::slice::from_ref(&small),
            "the kept outcome's round only"
        );
        let Ok(held) = rounds.resume(&small, (&a, None), Value::Null) else {
            panic!("the round is there");
        };
        match wait(held).await {
            Waited::Done(Ok(answer), _) => {
                assert_eq!(answer.result["content"][0]["text"], "done");
            }
            _ => panic!("the call's own result"),
        }
        let e = rounds
            .resume(&large, (&a, None), Value::Null)
            .err()
            .expect("no call to take up");
        assert!(e.message.contains("too large to keep"), "{}", e.message);
        // Another principal's, or an unknown id, is an invalid state as ever.
        let e = rounds
            .resume(&large, (&agent("b"), None), Value::Null)
            .err()
            .expect("not b's");
        assert_eq!(e.message, "invalid requestState");
        // An outcome is held to the byte budgets too: past its principal's, let go.
        let budgeted = ParkedRounds::with_caps(64, 4);
        let (mut held, question, _answer) = round();
        held.call = Call::inline(async {
            Ok(Answer {
                result: serde_json::json!({"text": "x".repeat(1000)}),
                server: "s".into(),
                input_required: false,
                rounds: 1,
                server_identity: None,
            })
        });
        let id = budgeted
            .park(
                (&a, None),
                "t".into(),
                (100, 500, usize::MAX),
                held,
                question,
                Instant::now() + std::time::Duration::from_secs(600),
            )
            .expect("parked");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        budgeted.sweep(std::time::Duration::MAX, |_, _, _, _| true);
        let e = budgeted
            .resume(&id, (&a, None), Value::Null)
            .err()
            .expect("let go");
        assert!(e.message.contains("too large to keep"), "{}", e.message);
    }

    // A round taken up whose request went before its call answered (its call cancelled
    // with it): a second answer is told so, not that its call went on. One whose call
    // went on stays told so.
    #[tokio::test]
    async fn a_round_whose_taking_request_went_is_told_as_cancelled() {
        let rounds = ParkedRounds::with_caps(64, 4);
        let a = agent("a");
        let (id, _, _answer) = park_as(&rounds, &a, None, (0, usize::MAX), 600);
        let id = id.expect("parked");
        let held = rounds.resume(&id, (&a, None), Value::Null).ok();
        assert!(held.is_some());
        let e = rounds
            .resume(&id, (&a, None), Value::Null)
            .err()
            .expect("used");
        assert_eq!(e.message, ANSWERED);
        // One whose call answered (or asked again): its call went on.
        rounds.taken_up(id.clone()).settled();
        let e = rounds
            .resume(&id, (&a, None), Value::Null)
            .err()
            .expect("used");
        assert_eq!(e.message, ANSWERED);
        // A request that took it up and went before its call answered.
        drop(rounds.taken_up(id.clone()));
        drop(held);
        let e = rounds
            .resume(&id, (&a, None), Value::Null)
            .err()
            .expect("used");
        assert_eq!(e.message, CANCELLED);
    }

    // Notes are shared fairly: one principal parking and answering many rounds does not
    // push out another's note, whose retry of an answer whose reply was lost is told
    // it was answered, not "invalid requestState" (which invites running the call again).
    #[tokio::test]
    async fn one_principals_rounds_do_not_push_out_anothers_notes() {
        let rounds = ParkedRounds::with_caps(4, 16);
        let (a, b) = (agent("a"), agent("b"));
        let (id, _, _answer) = park_as(&rounds, &b, None, (0, usize::MAX), 60);
        let id = id.expect("parked");
        let _held = rounds.resume(&id, (&b, None), Value::Null).ok();
        for _ in 0..8 {
            // Later to expire than b's note: by expiry alone, b's would go first.
            let (mine, _, _answer) = park_as(&rounds, &a, None, (0, usize::MAX), 600);
            let mine = mine.expect("parked");
            let _ = rounds.resume(&mine, (&a, None), Value::Null);
        }
        let e = rounds
            .resume(&id, (&b, None), Value::Null)
            .err()
            .expect("used");
        assert_eq!(e.message, ANSWERED);
        assert!(rounds.ended.lock().len() <= 4);
    }

    // A reload that shortens `state_ttl` shortens the rounds parked before it: their
    // states are refused from then on, and the rounds kept their places and calls
    // until their old expiry.
    #[tokio::test]
    async fn a_shorter_state_ttl_ends_the_rounds_parked_before_it() {
        let rounds = ParkedRounds::with_caps(64, 4);
        let a = agent("a");
        let (id, cancel, _answer) = park_as(&rounds, &a, None, (0, usize::MAX), 600);
        assert!(id.is_some());
        rounds.sweep(std::time::Duration::from_secs(600), |_, _, _, _| true);
        assert!(!cancel.is_cancelled(), "within the ttl");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        rounds.sweep(std::time::Duration::from_millis(10), |_, _, _, _| true);
        assert!(cancel.is_cancelled(), "its call ends with it");
        assert!(rounds.rounds.lock().is_empty());
    }

    /// Parks a round of `who` from `session`; its id, its call's token, its answer.
    fn park_as(
        rounds: &ParkedRounds,
        who: &Principal,
        session: Option<u64>,
        (bytes, budget): (usize, usize),
        expires_in: u64,
    ) -> (
        Option<String>,
        CancelToken,
        oneshot::Receiver<Result<Value, RpcError>>,
    ) {
        let (held, question, answer) = round();
        let cancel = held.cancel.clone();
        let expires = Instant::now() + std::time::Duration::from_secs(expires_in);
        let id = rounds.park(
            (who, session),
            "t".into(),
            (bytes, budget, usize::MAX),
            held,
            question,
            expires,
        );
        (id, cancel, answer)
    }

    // A client that stops retrying (its person declined) leaves its rounds behind: at
    // its share, its next round takes the place of its own that expires first.
    #[tokio::test]
    async fn a_principal_at_its_share_gives_up_its_own_first_round_not_its_next() {
        let rounds = ParkedRounds::with_caps(64, 2);
        let (a, b) = (agent("a"), agent("b"));
        let (a1, a1_cancel, _a1) = park_as(&rounds, &a, None, (0, usize::MAX), 30);
        let (a2, a2_cancel, mut a2_answer) = park_as(&rounds, &a, None, (0, usize::MAX), 10);
        let (b1, b1_cancel, _b1) = park_as(&rounds, &b, None, (0, usize::MAX), 5);
        let (a3, a3_cancel, _a3) = park_as(&rounds, &a, None, (0, usize::MAX), 60);
        assert!(a3.is_some() && b1.is_some(), "parked, not refused");
        assert!(
            a2_cancel.is_cancelled(),
            "a's round that expires first went"
        );
        assert!(
            matches!(a2_answer.try_recv(), Ok(Err(_))),
            "its question fails"
        );
        assert!(!a1_cancel.is_cancelled() && !a3_cancel.is_cancelled());
        assert!(
            !b1_cancel.is_cancelled(),
            "another principal's is not a's to give"
        );
        assert!(
            rounds
                .resume(&a1.expect("a1"), (&a, None), Value::Null)
                .is_ok()
        );
        // The answer that comes for the round dropped is told so.
        let e = rounds
            .resume(&a2.expect("a2"), (&a, None), Value::Null)
            .err()
            .expect("dropped");
        assert_eq!(e.message, REPLACED);
        // Another session's rounds are not this one's to give: at the share, refused.
        let (d, e) = (agent("d"), Some(7));
        let (_, d1_cancel, _d1) = park_as(&rounds, &d, e, (0, usize::MAX), 30);
        let (_, d2_cancel, _d2) = park_as(&rounds, &d, e, (0, usize::MAX), 30);
        let (other, _, mut other_answer) = park_as(&rounds, &d, Some(8), (0, usize::MAX), 30);
        assert!(other.is_none(), "refused: d's rounds are another session's");
        assert!(
            matches!(other_answer.try_recv(), Ok(Err(_))),
            "refused at once"
        );
        assert!(!d1_cancel.is_cancelled() && !d2_cancel.is_cancelled());
        // Its share in bytes too: a large round takes the place of a's earlier ones.
        let (_, c1_cancel, _c1) = park_as(&rounds, &agent("c"), None, (60, 100), 30);
        let (c2, c2_cancel, _c2) = park_as(&rounds, &agent("c"), None, (60, 100), 30);
        assert!(c2.is_some() && c1_cancel.is_cancelled() && !c2_cancel.is_cancelled());
    }

    #[tokio::test]
    async fn a_local_session_that_ends_drops_its_own_rounds_only() {
        let rounds = ParkedRounds::with_caps(64, 16);
        let a = agent("a");
        let (_, mine, _m) = park_as(&rounds, &a, Some(1), (0, usize::MAX), 60);
        let (on_2, other_session, _o) = park_as(&rounds, &a, Some(2), (0, usize::MAX), 60);
        let (http, over_http, _h) = park_as(&rounds, &a, None, (0, usize::MAX), 60);
        rounds.drop_session(1);
        assert!(mine.is_cancelled());
        assert!(!other_session.is_cancelled() && !over_http.is_cancelled());
        let http = http.expect("parked");
        // Taken up only on the channel that parked it, even by the same principal.
        for elsewhere in [Some(1), Some(2)] {
            let e = rounds
                .resume(&http, (&a, elsewhere), Value::Null)
                .err()
                .expect("another channel's");
            assert_eq!(e.message, "invalid requestState");
        }
        assert!(rounds.resume(&http, (&a, None), Value::Null).is_ok());
        let on_2 = on_2.expect("parked");
        assert!(rounds.resume(&on_2, (&a, None), Value::Null).is_err());
        assert!(rounds.resume(&on_2, (&a, Some(2)), Value::Null).is_ok());
        // Sent again (a retry after a lost answer): told its call went on, not that the
        // state is invalid.
        let e = rounds
            .resume(&on_2, (&a, Some(2)), Value::Null)
            .err()
            .expect("taken up once");
        assert!(e.message.contains("already answered"), "{}", e.message);
        assert_eq!(e.code, crate::protocol::error::INVALID_PARAMS);
    }

    #[tokio::test]
    async fn every_principals_first_large_round_counts_against_a_budget_for_all() {
        let rounds = ParkedRounds::with_caps(64, 4);
        let at = |s| Instant::now() + std::time::Duration::from_secs(s);
        let park = |who: &str, bytes, expires| {
            let (held, question, answer) = round();
            let cancel = held.cancel.clone();
            let id = rounds.park(
                (&agent(who), None),
                "t".into(),
                (bytes, usize::MAX, 100),
                held,
                question,
                expires,
            );
            (id, cancel, answer)
        };
        let (a1, a1_cancel, _a1) = park("a", 40, at(60));
        let (b1, ..) = park("b", 40, at(60));
        assert!(a1.is_some() && b1.is_some());
        // Nobody holds two more rounds than c: c's first large round is refused, and
        // no round goes for nothing (a's small one would not have made room).
        let (a2, a2_cancel, _a2) = park("a", 10, at(30));
        assert!(a2.is_some());
        let (c1, _, mut refused) = park("c", 40, at(60));
        assert!(c1.is_none());
        assert!(matches!(refused.try_recv(), Ok(Err(_))), "refused at once");
        assert!(!a1_cancel.is_cancelled() && !a2_cancel.is_cancelled());
        // a holds a third: now its rounds that expire first make room.
        let (a3, a3_cancel, _a3) = park("a", 10, at(90));
        assert!(a3.is_some(), "within a's share of the places");
        let (d1, ..) = park("d", 40, at(60));
        assert!(d1.is_some(), "room made from a's rounds");
        assert!(a2_cancel.is_cancelled(), "a's first to expire went");
        assert!(!a3_cancel.is_cancelled());
    }

    #[tokio::test]
    async fn when_all_places_are_taken_the_principal_holding_most_gives_up_its_first_round() {
        let rounds = ParkedRounds::with_caps(4, 3);
        let (a, b, c) = (agent("a"), agent("b"), agent("c"));
        let later = |s| Instant::now() + std::time::Duration::from_secs(s);
        let mut a_rounds = Vec::new();
        for s in [30, 10, 20] {
            let (held, question, answer) = round();
            let cancel = held.cancel.clone();
            let id = rounds
                .park(
                    (&a, None),
                    "t".into(),
                    (0, usize::MAX, usize::MAX),
                    held,
                    question,
                    later(s),
                )
                .expect("a parks");
            a_rounds.push((id, cancel, answer));
        }
        let (held, question, _b_answer) = round();
        rounds
            .park(
                (&b, None),
                "t".into(),
                (0, usize::MAX, usize::MAX),
                held,
                question,
                later(40),
            )
            .expect("b parks");
        // Full: c takes the place of a's round that expires first.
        let (held, question, _c_answer) = round();
        rounds
            .park(
                (&c, None),
                "t".into(),
                (0, usize::MAX, usize::MAX),
                held,
                question,
                later(50),
            )
            .expect("c parks");
        let (first, cancel, mut answer) = a_rounds.remove(1);
        assert!(
            cancel.is_cancelled(),
            "the dropped round's call is cancelled"
        );
        assert!(
            matches!(answer.try_recv(), Ok(Err(_))),
            "its question fails"
        );
        // Its answer is told why, not that the state is invalid.
        let e = rounds
            .resume(&first, (&a, None), Value::Null)
            .err()
            .expect("dropped");
        assert_eq!(e.message, FREED);
        for (_, cancel, _) in &a_rounds {
            assert!(!cancel.is_cancelled());
        }
        // Now a holds two, b and c one each: nobody holds two more than b or a.
        for who in [&b, &a] {
            let (held, question, mut answer) = round();
            assert!(
                rounds
                    .park(
                        (who, None),
                        "t".into(),
                        (0, usize::MAX, usize::MAX),
                        held,
                        question,
                        later(60)
                    )
                    .is_none()
            );
            assert!(matches!(answer.try_recv(), Ok(Err(_))), "refused at once");
        }
        // A newcomer still takes one of a's (two against none).
        let (held, question, _d_answer) = round();
        rounds
            .park(
                (&agent("d"), None),
                "t".into(),
                (0, usize::MAX, usize::MAX),
                held,
                question,
                later(70),
            )
            .expect("d parks");
        let cancelled = a_rounds.iter().filter(|(_, c, _)| c.is_cancelled());
        assert_eq!(cancelled.count(), 1);
    }
}
