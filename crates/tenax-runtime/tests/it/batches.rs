use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tenax_core::{
    BatchCommand, BatchItem, Batched, CommandError, Registry, RetryPolicy, TaskContext, TaskRecord,
    TaskStatus,
};
use tenax_runtime::Client;
use tenax_storage::testing::Harness;
use tenax_storage::{FailNext, Lease, Storage, TaskFailParams, TaskListParams, TaskRef};

use crate::support::{fast, wait_for, Env};

/// What the handler answers for one notice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Answer {
    Sent,
    /// Retryable at every attempt: dies when its attempts are spent.
    Busy,
    /// Permanent: dies at once.
    Rejected,
    /// Sent, but its lease is taken away (the task failed by someone else) while the
    /// batch runs.
    SentButStolen,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Notice {
    n: u32,
    partner: String,
    answer: Answer,
}

/// One handler call: the numbers of its notices, with their partner.
type Call = Vec<(u32, String)>;

#[derive(Default)]
struct Seen {
    calls: Mutex<Vec<Call>>,
    compensated: Mutex<BTreeSet<u32>>,
}

struct SendNotices {
    seen: Arc<Seen>,
    storage: Arc<dyn Storage>,
}

const MAX_BATCH: u32 = 10;
const MAX_WAIT: Duration = Duration::from_millis(1000);

impl BatchCommand for SendNotices {
    const TYPE: &'static str = "SEND_NOTICES";
    const MAX_BATCH: u32 = MAX_BATCH;
    const MAX_WAIT: Duration = MAX_WAIT;
    const MAX_ATTEMPTS: u32 = 3;
    type Context = Notice;
    type Output = String;

    fn batch_key(&self, notice: &Notice) -> Option<String> {
        Some(notice.partner.clone())
    }

    async fn execute_batch(
        &self,
        items: Vec<BatchItem<Notice>>,
    ) -> Vec<Result<String, CommandError>> {
        let call = items
            .iter()
            .map(|i| (i.context.n, i.context.partner.clone()))
            .collect();
        self.seen.calls.lock().unwrap().push(call);
        let mut outcomes = Vec::new();
        for item in &items {
            let n = item.context.n;
            outcomes.push(match item.context.answer {
                Answer::Sent => Ok(format!("sent {n} (attempt {})", item.task.attempt())),
                Answer::Busy => Err(CommandError::retryable(format!("partner busy for {n}"))),
                Answer::Rejected => Err(CommandError::permanent(format!("rejected {n}"))),
                Answer::SentButStolen => {
                    let stolen = self
                        .storage
                        .task_fail_if_leased(&TaskFailParams {
                            lease: Lease {
                                id: item.task.id(),
                                epoch: item.task.lease_epoch(),
                            },
                            error: format!("taken away from {n}"),
                            next: FailNext::Retry(Duration::from_secs(3600)),
                            now: None,
                        })
                        .await
                        .unwrap();
                    assert!(stolen);
                    Ok(format!("sent {n} after all"))
                }
            });
        }
        outcomes
    }

    async fn compensate(&self, notice: Notice, _: &TaskContext) -> Result<(), CommandError> {
        self.seen.compensated.lock().unwrap().insert(notice.n);
        Ok(())
    }

    fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy::fixed(Duration::from_millis(10))
    }
}

struct Case {
    env: Env,
    harness: Harness,
    client: Client,
    seen: Arc<Seen>,
}

impl Case {
    async fn new(harness: Option<Harness>) -> Option<Self> {
        let harness = harness?;
        Some(Self {
            env: Env::new().await,
            client: Client::new(harness.storage.clone()),
            harness,
            seen: Arc::new(Seen::default()),
        })
    }

    fn registry(&self) -> Registry {
        let mut registry = Registry::new();
        registry
            .register_batch(SendNotices {
                seen: self.seen.clone(),
                storage: self.harness.storage.clone(),
            })
            .unwrap();
        registry
    }

    async fn enqueue(&self, n: u32, partner: &str, answer: Answer) -> TaskRecord {
        self.client
            .enqueue::<Batched<SendNotices>>(Notice {
                n,
                partner: partner.to_owned(),
                answer,
            })
            .task_no(format!("notice-{n}"))
            .await
            .unwrap()
            .task
    }

    async fn task(&self, n: u32) -> TaskRecord {
        self.client
            .get(&TaskRef::No(
                tenax_core::TaskNo::new(format!("notice-{n}")).unwrap(),
            ))
            .await
            .unwrap()
            .unwrap()
    }

    /// Wait until every execute task of the type is in a final or long-delayed state.
    async fn wait_settled(&self, count: usize) -> Vec<TaskRecord> {
        let storage = self.harness.storage.clone();
        wait_for("every notice settled", || {
            let storage = storage.clone();
            async move {
                let tasks: Vec<TaskRecord> = storage
                    .task_list(&TaskListParams {
                        command_type: Some("SEND_NOTICES".into()),
                        limit: 1000,
                        ..Default::default()
                    })
                    .await
                    .unwrap()
                    .into_iter()
                    .filter(|t| t.kind == tenax_core::TaskKind::Execute)
                    .collect();
                let settled = tasks.iter().all(|t| {
                    matches!(t.status, TaskStatus::Succeeded | TaskStatus::Dead)
                        || t.last_error
                            .as_deref()
                            .is_some_and(|e| e.starts_with("taken away"))
                });
                (tasks.len() == count && settled).then_some(tasks)
            }
        })
        .await
    }

    fn calls(&self) -> Vec<Call> {
        self.seen.calls.lock().unwrap().clone()
    }
}

async fn mixed_outcomes_land_on_their_own_tasks(harness: Option<Harness>) {
    let Some(case) = Case::new(harness).await else {
        return;
    };
    // One batch of nine, before the worker starts: three of each answer.
    let answers = [Answer::Sent, Answer::Busy, Answer::Rejected];
    for n in 0..9 {
        case.enqueue(n, "bank-a", answers[n as usize % 3]).await;
    }
    let worker = case
        .env
        .start(case.harness.reopen().await, case.registry(), fast());
    case.wait_settled(9).await;
    let dead: BTreeSet<u32> = (0..9).filter(|n| n % 3 != 0).collect();
    let compensated = &case.seen.compensated;
    let dead = &dead;
    wait_for("each dead notice compensated", || async move {
        (*compensated.lock().unwrap() == *dead).then_some(())
    })
    .await;
    worker.shutdown().await;

    for n in 0..9 {
        let task = case.task(n).await;
        match answers[n as usize % 3] {
            Answer::Sent => {
                assert_eq!(task.status, TaskStatus::Succeeded, "{task:?}");
                assert_eq!(task.attempt, 1);
                assert_eq!(task.result, Some(format!("\"sent {n} (attempt 1)\"")));
            }
            Answer::Busy => {
                // Its own budget: three attempts, each retried after its own backoff.
                assert_eq!(task.status, TaskStatus::Dead, "{task:?}");
                assert_eq!(task.attempt, 3);
                let error = task.last_error.unwrap_or_default();
                assert!(error.contains(&format!("partner busy for {n}")), "{error}");
                let attempts = case.client.attempts(task.id).await.unwrap();
                assert_eq!(attempts.len(), 3);
            }
            Answer::Rejected => {
                assert_eq!(task.status, TaskStatus::Dead, "{task:?}");
                assert_eq!(task.attempt, 1);
                let error = task.last_error.unwrap_or_default();
                assert!(error.contains(&format!("rejected {n}")), "{error}");
            }
            Answer::SentButStolen => unreachable!(),
        }
    }
    // The first call held all nine; the retries of the busy ones came in later
    // batches of their own.
    let calls = case.calls();
    assert_eq!(calls[0].len(), 9, "{calls:?}");
    let busy_runs: usize = calls.iter().flatten().filter(|(n, _)| n % 3 == 1).count();
    assert_eq!(
        busy_runs, 9,
        "three busy notices, three attempts each: {calls:?}"
    );
    case.env.assert_no_overlap().await;
}

async fn batches_stay_within_their_size_key_and_wait(harness: Option<Harness>) {
    let Some(case) = Case::new(harness).await else {
        return;
    };
    // 25 notices for two partners, due before the worker starts.
    for n in 0..25 {
        let partner = if n % 2 == 0 { "bank-a" } else { "bank-b" };
        case.enqueue(n, partner, Answer::Sent).await;
    }
    let worker = case
        .env
        .start(case.harness.reopen().await, case.registry(), fast());
    case.wait_settled(25).await;
    let calls = case.calls();
    let mut seen = BTreeSet::new();
    for call in &calls {
        assert!(
            !call.is_empty() && call.len() <= MAX_BATCH as usize,
            "{calls:?}"
        );
        let partners: BTreeSet<&String> = call.iter().map(|(_, p)| p).collect();
        assert_eq!(partners.len(), 1, "one partner per batch: {calls:?}");
        for (n, _) in call {
            assert!(seen.insert(*n), "notice {n} ran twice: {calls:?}");
        }
    }
    assert_eq!(seen.len(), 25);
    // The first claims were full (ten tasks, split by partner).
    let first_two: usize = calls.iter().take(2).map(Vec::len).sum();
    assert_eq!(first_two, MAX_BATCH as usize, "{calls:?}");

    // Three notices trickle in: they wait for MAX_WAIT after the first became due,
    // then run as one batch.
    let before = case.calls().len();
    let mut trickle = Vec::new();
    for n in 100..103 {
        trickle.push(case.enqueue(n, "bank-a", Answer::Sent).await);
    }
    case.wait_settled(28).await;
    worker.shutdown().await;
    let calls = case.calls();
    assert_eq!(calls.len(), before + 1, "one more batch: {calls:?}");
    assert_eq!(
        calls[before].iter().map(|(n, _)| *n).collect::<Vec<_>>(),
        vec![100, 101, 102]
    );
    let first_due = trickle.iter().map(|t| t.run_at).min().unwrap();
    let mut started = BTreeMap::new();
    for n in 100..103 {
        let task = case.task(n).await;
        started.insert(n, task.started_at.expect("started"));
    }
    let claimed = *started.values().min().unwrap();
    let waited = (claimed - first_due).to_std().unwrap_or_default();
    assert!(
        waited + Duration::from_millis(5) >= MAX_WAIT,
        "claimed after {waited:?}, before the maximum wait"
    );
    assert!(
        waited <= MAX_WAIT + Duration::from_millis(1500),
        "claimed after {waited:?}, long past the maximum wait"
    );
    case.env.assert_no_overlap().await;
}

async fn a_lost_lease_in_a_batch_drops_only_that_outcome(harness: Option<Harness>) {
    let Some(case) = Case::new(harness).await else {
        return;
    };
    let stolen = [1u32, 4];
    for n in 0..6 {
        let answer = if stolen.contains(&n) {
            Answer::SentButStolen
        } else {
            Answer::Sent
        };
        case.enqueue(n, "bank-a", answer).await;
    }
    let worker = case
        .env
        .start(case.harness.reopen().await, case.registry(), fast());
    case.wait_settled(6).await;
    worker.shutdown().await;
    for n in 0..6 {
        let task = case.task(n).await;
        if stolen.contains(&n) {
            // The handler said "sent", but the lease was gone: the guarded write
            // refused it, and the task is as the other writer left it.
            assert_eq!(task.status, TaskStatus::Retrying, "{task:?}");
            assert_eq!(task.result, None);
            assert_eq!(task.last_error, Some(format!("taken away from {n}")));
        } else {
            assert_eq!(task.status, TaskStatus::Succeeded, "{task:?}");
            assert!(task.result.unwrap().starts_with(&format!("\"sent {n}")));
        }
    }
    case.env.assert_no_overlap().await;
}

macro_rules! on_every_backend {
    ($($case:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(tenax_storage::testing::sqlite_file().await).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(tenax_storage::testing::postgres_from_env().await).await;
                }
            )*
        }
        mod mysql {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(tenax_storage::testing::mysql_from_env().await).await;
                }
            )*
        }
    };
}

on_every_backend!(
    mixed_outcomes_land_on_their_own_tasks,
    batches_stay_within_their_size_key_and_wait,
    a_lost_lease_in_a_batch_drops_only_that_outcome,
);
