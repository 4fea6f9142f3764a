//! The relay's decisions apart from its I/O: in which waves a claim is published, what each
//! outcome makes of its event, and when a wave's failures say that the broker is away. Pure
//! functions over values, tested below; `publish.rs` does the I/O around them (the broker's
//! publish and health check, the write-back).

use std::collections::{HashMap, VecDeque};

use crate::store::{
    Failure, FailureClass,
    relay::{ClaimedEvent, FailedEvent, Settlement},
};
use crate::transport::{PublishError, TransportError};
use crate::util::backoff::Backoff;

/// One event's publish and its result.
pub(super) type Outcome<'a> = (&'a ClaimedEvent, Result<(), PublishError>);

/// The settings the decisions read.
#[derive(Debug, Clone, Copy)]
pub(super) struct Policy {
    /// Attempts before an event is DEAD.
    pub(super) max_attempts: u32,
    /// The delay before each retry.
    pub(super) backoff: Backoff,
}

/// A claim's events in the order they may go out: with ordering, one queue per aggregate (its
/// events in claim order), of which each wave takes the heads; without, one wave of them all.
pub(super) struct Waves<'a> {
    queues: Vec<VecDeque<&'a ClaimedEvent>>,
    ordering: bool,
}

impl<'a> Waves<'a> {
    pub(super) fn new(events: &'a [ClaimedEvent], ordering: bool) -> Self {
        if !ordering {
            return Waves {
                queues: vec![events.iter().collect()],
                ordering,
            };
        }
        let mut index: HashMap<(&str, &str), usize> = HashMap::new();
        let mut queues: Vec<VecDeque<&ClaimedEvent>> = Vec::new();
        for event in events {
            let key = (event.aggregate_type.as_str(), event.aggregate_id.as_str());
            let slot = *index.entry(key).or_insert_with(|| {
                queues.push(VecDeque::new());
                queues.len() - 1
            });
            queues[slot].push_back(event);
        }
        Waves { queues, ordering }
    }

    /// The next wave (empty when every event has gone out or was handed back).
    pub(super) fn next_wave(&mut self) -> Vec<&'a ClaimedEvent> {
        if self.ordering {
            self.queues
                .iter_mut()
                .filter_map(VecDeque::pop_front)
                .collect()
        } else {
            self.queues.iter_mut().flat_map(|q| q.drain(..)).collect()
        }
    }

    /// Hand back, unpublished and with no attempt counted, the events `held` says must wait
    /// (their destination is paused) and, with ordering, everything behind each in its
    /// aggregate. Returns the events held (not those behind them).
    pub(super) fn hold(
        &mut self,
        held: impl Fn(&ClaimedEvent) -> bool,
        settlement: &mut Settlement,
    ) -> Vec<&'a ClaimedEvent> {
        let mut first_held = Vec::new();
        for queue in &mut self.queues {
            if self.ordering {
                if let Some(at) = queue.iter().position(|e| held(e)) {
                    first_held.push(queue[at]);
                    release(settlement, queue.drain(at..));
                }
            } else {
                let (stay, go): (Vec<&ClaimedEvent>, Vec<&ClaimedEvent>) =
                    queue.drain(..).partition(|e| !held(e));
                first_held.extend(go.iter().copied());
                release(settlement, go.into_iter());
                queue.extend(stay);
            }
        }
        first_held
    }

    /// Hand back what waits behind `failed` in its aggregate (nothing without ordering).
    pub(super) fn release_behind(&mut self, failed: &ClaimedEvent, settlement: &mut Settlement) {
        if !self.ordering {
            return;
        }
        if let Some(queue) = self.queues.iter_mut().find(|q| {
            q.front().is_some_and(|next| {
                next.aggregate_type == failed.aggregate_type
                    && next.aggregate_id == failed.aggregate_id
            })
        }) {
            release(settlement, queue.drain(..));
        }
    }

    /// Hand back everything not yet published.
    pub(super) fn release_rest(&mut self, settlement: &mut Settlement) {
        for queue in &mut self.queues {
            release(settlement, queue.drain(..));
        }
    }
}

/// Hand events back unpublished: PENDING again, a reclaim's counted attempt given back.
pub(super) fn release<'a>(
    settlement: &mut Settlement,
    events: impl Iterator<Item = &'a ClaimedEvent>,
) {
    for event in events {
        settlement.released.push(event.id);
        if event.reclaimed {
            settlement.released_reclaimed.push(event.id);
        }
    }
}

/// What a wave's failures say about the broker before its health check is asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Suspicion {
    /// No failure says anything about the broker.
    None,
    /// A connection was lost: the broker is unavailable, whatever its health check says.
    Lost(String),
    /// A confirm did not come in time: the broker is unavailable if its health check fails
    /// too, or if it is on trial after an outage.
    TimedOut,
}

/// What the outcomes of a wave suspect of the broker.
pub(super) fn suspicion(outcomes: &[Outcome<'_>]) -> Suspicion {
    if let Some(lost) = outcomes.iter().find_map(|(_, r)| match r {
        Err(error @ PublishError::Connection(_)) => Some(error.to_string()),
        _ => None,
    }) {
        return Suspicion::Lost(lost);
    }
    if outcomes
        .iter()
        .any(|(_, r)| matches!(r, Err(PublishError::Timeout(_))))
    {
        return Suspicion::TimedOut;
    }
    Suspicion::None
}

/// The broker is unavailable: why, and whether it was on trial after an outage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Outage {
    pub(super) reason: String,
    pub(super) on_trial: bool,
}

/// Whether a wave whose confirms timed out says the broker is unavailable: when its health
/// check fails, or when it answers but is on trial (it has confirmed nothing since an outage).
pub(super) fn after_timeout(
    health: Result<(), TransportError>,
    on_trial: bool,
    transport: &str,
) -> Option<Outage> {
    match health {
        Err(e) => Some(Outage {
            reason: e.to_string(),
            on_trial: false,
        }),
        Ok(()) if on_trial => Some(Outage {
            reason: format!(
                "no confirmation from the broker within the publish timeout since it came back \
                 ({transport} on trial)"
            ),
            on_trial: true,
        }),
        Ok(()) => None,
    }
}

/// The class a failed publish is stored under.
pub(super) fn failure_class(error: &PublishError) -> FailureClass {
    match error {
        PublishError::Timeout(_) => FailureClass::Timeout,
        PublishError::Connection(_) => FailureClass::Connection,
        PublishError::Rejected(_) => FailureClass::Rejected,
        PublishError::Permanent(_) => FailureClass::Permanent,
    }
}

/// What one failed publish makes of its event: RETRY after the backoff, or DEAD when the
/// rejection is permanent or the attempts are spent.
pub(super) fn failed(event: &ClaimedEvent, error: &PublishError, policy: &Policy) -> FailedEvent {
    FailedEvent {
        id: event.id,
        failure: Failure::after(
            event.attempts + 1,
            policy.max_attempts,
            error.is_permanent(),
            || policy.backoff.delay(event.attempts),
            error.to_string(),
        ),
        class: failure_class(error),
    }
}

/// What a published wave decided, beside the settlement it added to.
#[derive(Debug, Default)]
pub(super) struct WaveDecided<'a> {
    /// The events that failed, in the order of `settlement.failed`'s new entries.
    pub(super) failed: Vec<&'a ClaimedEvent>,
    /// The first failure a retry may cure.
    pub(super) transient_error: Option<String>,
}

/// Settle a published wave into `settlement`. Confirmed events are SENT. While the broker is
/// unavailable (`outage`), a failure that may be the outage's is no event's fault: the event is
/// handed back without an attempt counted. Any other failure counts an attempt (RETRY or DEAD)
/// and, with ordering, hands back the rest of its aggregate.
pub(super) fn settle_wave<'a>(
    outcomes: Vec<Outcome<'a>>,
    outage: bool,
    policy: &Policy,
    waves: &mut Waves<'a>,
    settlement: &mut Settlement,
) -> WaveDecided<'a> {
    let mut decided = WaveDecided::default();
    for (event, result) in outcomes {
        match result {
            Ok(()) => settlement.sent.push(event.id),
            Err(error) if outage && error.may_be_unavailable() => {
                release(settlement, std::iter::once(event));
            }
            Err(error) => {
                if !error.is_permanent() && decided.transient_error.is_none() {
                    decided.transient_error = Some(error.to_string());
                }
                settlement.failed.push(failed(event, &error, policy));
                decided.failed.push(event);
                waves.release_behind(event, settlement);
            }
        }
    }
    decided
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use chrono::Utc;
    use uuid::Uuid;

    use super::*;

    fn event(id: i64, aggregate: &str, attempts: u32, reclaimed: bool) -> ClaimedEvent {
        ClaimedEvent {
            id,
            event_id: Uuid::nil(),
            source: "test".into(),
            event_type: "cart.line_added".into(),
            schema_version: 1,
            aggregate_type: "cart".into(),
            aggregate_id: aggregate.into(),
            aggregate_version: None,
            payload: "{}".into(),
            headers: "{}".into(),
            created_at: Utc::now(),
            attempts,
            reclaimed,
        }
    }

    /// An event of `event_type` (the destination in these tests).
    fn typed(id: i64, aggregate: &str, event_type: &str) -> ClaimedEvent {
        ClaimedEvent {
            event_type: event_type.into(),
            ..event(id, aggregate, 0, false)
        }
    }

    #[test]
    fn a_paused_destination_holds_its_events_and_what_follows_them() {
        let events = vec![
            typed(1, "a", "paused"),
            typed(2, "a", "open"),
            typed(3, "b", "open"),
            typed(4, "b", "paused"),
            typed(5, "b", "open"),
            typed(6, "c", "open"),
        ];
        let mut settlement = Settlement::default();
        let mut waves = Waves::new(&events, true);
        let held = waves.hold(|e| e.event_type == "paused", &mut settlement);
        let held: Vec<i64> = held.iter().map(|e| e.id).collect();
        assert_eq!(held, [1, 4]);
        // Behind each held event its aggregate's later events wait; the rest goes out.
        let mut released = settlement.released.clone();
        released.sort_unstable();
        assert_eq!(released, [1, 2, 4, 5]);
        let mut published = Vec::new();
        loop {
            let wave = waves.next_wave();
            if wave.is_empty() {
                break;
            }
            published.extend(wave.iter().map(|e| e.id));
        }
        published.sort_unstable();
        assert_eq!(published, [3, 6]);

        // Without ordering only the paused destination's events wait.
        let mut settlement = Settlement::default();
        let mut waves = Waves::new(&events, false);
        waves.hold(|e| e.event_type == "paused", &mut settlement);
        assert_eq!(settlement.released, [1, 4]);
        assert_eq!(
            waves.next_wave().iter().map(|e| e.id).collect::<Vec<_>>(),
            [2, 3, 5, 6]
        );
    }

    fn policy() -> Policy {
        Policy {
            max_attempts: 3,
            backoff: Backoff::default()
                .base(Duration::from_secs(1))
                .cap(Duration::from_secs(60))
                .jitter(0.0),
        }
    }

    fn ids(wave: &[&ClaimedEvent]) -> Vec<i64> {
        wave.iter().map(|e| e.id).collect()
    }

    #[test]
    fn waves_take_one_event_of_each_aggregate_at_a_time_with_ordering() {
        let events = [
            event(1, "a", 0, false),
            event(2, "b", 0, false),
            event(3, "a", 0, false),
            event(4, "c", 0, false),
            event(5, "a", 0, false),
        ];
        let mut waves = Waves::new(&events, true);
        assert_eq!(ids(&waves.next_wave()), [1, 2, 4]);
        assert_eq!(ids(&waves.next_wave()), [3]);
        assert_eq!(ids(&waves.next_wave()), [5]);
        assert!(waves.next_wave().is_empty());

        let mut waves = Waves::new(&events, false);
        assert_eq!(ids(&waves.next_wave()), [1, 2, 3, 4, 5]);
        assert!(waves.next_wave().is_empty());
    }

    #[test]
    fn the_fate_of_a_failed_publish() {
        let cases: &[(&str, PublishError, u32, Option<Duration>, FailureClass)] = &[
            // (what, error, attempts before, Some(delay) for RETRY / None for DEAD, class)
            (
                "first rejection",
                PublishError::Rejected("no".into()),
                0,
                Some(Duration::from_secs(1)),
                FailureClass::Rejected,
            ),
            (
                "second timeout doubles the delay",
                PublishError::Timeout(Duration::from_secs(5)),
                1,
                Some(Duration::from_secs(2)),
                FailureClass::Timeout,
            ),
            (
                "the last attempt",
                PublishError::Rejected("no".into()),
                2,
                None,
                FailureClass::Rejected,
            ),
            (
                "a permanent rejection at once",
                PublishError::Permanent("too large".into()),
                0,
                None,
                FailureClass::Permanent,
            ),
            (
                "a lost connection while the broker answers",
                PublishError::Connection("reset".into()),
                0,
                Some(Duration::from_secs(1)),
                FailureClass::Connection,
            ),
        ];
        for (what, error, before, delay, class) in cases {
            let decided = failed(&event(7, "a", *before, false), error, &policy());
            assert_eq!(decided.id, 7, "{what}");
            assert_eq!(decided.class, *class, "{what}");
            assert_eq!(decided.failure.attempts(), before + 1, "{what}");
            assert_eq!(decided.failure.error(), error.to_string(), "{what}");
            match (&decided.failure, delay) {
                (Failure::Retry { delay: got, .. }, Some(want)) => assert_eq!(got, want, "{what}"),
                (Failure::Dead { .. }, None) => {}
                (got, want) => panic!("{what}: {got:?}, expected delay {want:?}"),
            }
        }
    }

    #[test]
    fn what_a_wave_suspects_of_the_broker() {
        let (a, b) = (event(1, "a", 0, false), event(2, "b", 0, false));
        let timeout = || Err(PublishError::Timeout(Duration::from_secs(5)));
        let lost = || Err(PublishError::Connection("reset".into()));
        let rejected = || Err(PublishError::Rejected("no route".into()));
        let cases: Vec<(Vec<Outcome<'_>>, Suspicion)> = vec![
            (vec![(&a, Ok(())), (&b, Ok(()))], Suspicion::None),
            (vec![(&a, rejected()), (&b, Ok(()))], Suspicion::None),
            (vec![(&a, Ok(())), (&b, timeout())], Suspicion::TimedOut),
            (
                vec![(&a, timeout()), (&b, lost())],
                Suspicion::Lost("broker connection failed: reset".into()),
            ),
            (vec![], Suspicion::None),
        ];
        for (outcomes, expected) in cases {
            assert_eq!(suspicion(&outcomes), expected, "{outcomes:?}");
        }
    }

    #[test]
    fn a_timeout_is_an_outage_when_the_health_check_fails_or_the_broker_is_on_trial() {
        let down = || Err(TransportError::new("nats", "connection refused"));
        assert_eq!(
            after_timeout(down(), false, "nats"),
            Some(Outage {
                reason: "nats transport: connection refused".into(),
                on_trial: false
            })
        );
        assert_eq!(
            after_timeout(down(), true, "nats").map(|o| o.on_trial),
            Some(false)
        );
        let trial = after_timeout(Ok(()), true, "nats").unwrap();
        assert!(
            trial.on_trial && trial.reason.contains("nats on trial"),
            "{trial:?}"
        );
        assert_eq!(after_timeout(Ok(()), false, "nats"), None);
    }

    #[test]
    fn settling_a_wave() {
        struct Case {
            what: &'static str,
            ordering: bool,
            outage: bool,
            /// Per event of the first wave: None = confirmed, Some(error).
            outcomes: Vec<Option<PublishError>>,
            sent: Vec<i64>,
            failed: Vec<i64>,
            released: Vec<i64>,
            reclaimed: Vec<i64>,
            transient: Option<&'static str>,
            next_wave: Vec<i64>,
        }
        // Events 1 and 3 are cart a, 2 and 4 cart b, 5 cart c; 3 was reclaimed.
        let events = [
            event(1, "a", 0, false),
            event(2, "b", 0, false),
            event(3, "a", 1, true),
            event(4, "b", 0, false),
            event(5, "c", 0, false),
        ];
        let rejected = || Some(PublishError::Rejected("no route".into()));
        let timeout = || Some(PublishError::Timeout(Duration::from_secs(5)));
        let permanent = || Some(PublishError::Permanent("too large".into()));
        let cases = vec![
            Case {
                what: "all confirmed",
                ordering: true,
                outage: false,
                outcomes: vec![None, None, None],
                sent: vec![1, 2, 5],
                failed: vec![],
                released: vec![],
                reclaimed: vec![],
                transient: None,
                next_wave: vec![3, 4],
            },
            Case {
                what: "a rejection holds its aggregate back, not the others",
                ordering: true,
                outage: false,
                outcomes: vec![rejected(), None, None],
                sent: vec![2, 5],
                failed: vec![1],
                released: vec![3],
                reclaimed: vec![3],
                transient: Some("broker rejected the message: no route"),
                next_wave: vec![4],
            },
            Case {
                what: "a permanent rejection is no transient error",
                ordering: true,
                outage: false,
                outcomes: vec![None, permanent(), None],
                sent: vec![1, 5],
                failed: vec![2],
                released: vec![4],
                reclaimed: vec![],
                transient: None,
                next_wave: vec![3],
            },
            Case {
                what: "during an outage a timeout is no event's fault",
                ordering: true,
                outage: true,
                outcomes: vec![timeout(), None, rejected()],
                sent: vec![2],
                failed: vec![5],
                released: vec![1],
                reclaimed: vec![],
                transient: Some("broker rejected the message: no route"),
                next_wave: vec![3, 4],
            },
            Case {
                what: "a timeout while the broker answers counts an attempt",
                ordering: true,
                outage: false,
                outcomes: vec![timeout(), None, None],
                sent: vec![2, 5],
                failed: vec![1],
                released: vec![3],
                reclaimed: vec![3],
                transient: Some("no confirmation from the broker within 5s"),
                next_wave: vec![4],
            },
            Case {
                what: "without ordering a failure holds nothing back",
                ordering: false,
                outage: false,
                outcomes: vec![rejected(), None, None, None, None],
                sent: vec![2, 3, 4, 5],
                failed: vec![1],
                released: vec![],
                reclaimed: vec![],
                transient: Some("broker rejected the message: no route"),
                next_wave: vec![],
            },
        ];
        for case in cases {
            let policy = policy();
            let mut waves = Waves::new(&events, case.ordering);
            let wave = waves.next_wave();
            assert_eq!(wave.len(), case.outcomes.len(), "{}", case.what);
            let outcomes = wave
                .into_iter()
                .zip(case.outcomes)
                .map(|(e, error)| (e, error.map_or(Ok(()), Err)))
                .collect();
            let mut settlement = Settlement::default();
            let decided = settle_wave(outcomes, case.outage, &policy, &mut waves, &mut settlement);
            let failed: Vec<i64> = settlement.failed.iter().map(|f| f.id).collect();
            assert_eq!(settlement.sent, case.sent, "{}", case.what);
            assert_eq!(failed, case.failed, "{}", case.what);
            assert_eq!(ids(&decided.failed), case.failed, "{}", case.what);
            assert_eq!(settlement.released, case.released, "{}", case.what);
            assert_eq!(
                settlement.released_reclaimed, case.reclaimed,
                "{}",
                case.what
            );
            assert_eq!(
                decided.transient_error.as_deref(),
                case.transient,
                "{}",
                case.what
            );
            assert_eq!(ids(&waves.next_wave()), case.next_wave, "{}", case.what);
        }
    }

    #[test]
    fn the_rest_of_a_claim_is_handed_back_with_reclaims_given_back() {
        let events = [
            event(1, "a", 0, false),
            event(2, "a", 2, true),
            event(3, "b", 0, false),
        ];
        let mut waves = Waves::new(&events, true);
        let first = waves.next_wave();
        let mut settlement = Settlement::default();
        release(&mut settlement, first.into_iter());
        waves.release_rest(&mut settlement);
        assert_eq!(settlement.released, [1, 3, 2]);
        assert_eq!(settlement.released_reclaimed, [2]);
        assert!(waves.next_wave().is_empty());
    }
}
