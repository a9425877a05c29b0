//! The seeded fault schedule of a run: kills, database restarts and clock steps, proxy
//! faults, pauses, SIGTERMs and worker clock jumps, shuffled and spread over the run,
//! with the stale-write probes between them.
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use tenax::storage::{Lease, Storage, TaskCompleteParams, TaskListParams};
use tenax::{CompensationState, TaskStatus};

use super::{Injected, Plan, Store};
use crate::fleet::Fleet;
use crate::ledger::Ledger;
use crate::proxy::{FaultProxy, Mode};

#[derive(Debug, Clone, Copy)]
enum Event {
    Kill,
    Restart,
    Proxy,
    Pause,
    Term,
    Jump,
    DbStep,
}

#[allow(clippy::too_many_arguments)]
pub(super) async fn faults(
    plan: &Plan,
    rng: &mut StdRng,
    fleet: &mut Fleet,
    ledger: &Ledger,
    storage: &Arc<dyn Storage>,
    store: &mut Store,
    proxy: Option<&FaultProxy>,
    injected: &mut Injected,
    stale_accepted: &mut usize,
) -> anyhow::Result<()> {
    let mut events = Vec::new();
    events.extend(std::iter::repeat_n(Event::Kill, plan.kills));
    events.extend(std::iter::repeat_n(Event::Restart, plan.db_restarts));
    events.extend(std::iter::repeat_n(Event::Proxy, plan.proxy_faults));
    events.extend(std::iter::repeat_n(Event::Pause, plan.pauses));
    events.extend(std::iter::repeat_n(Event::Term, plan.terms));
    events.extend(std::iter::repeat_n(Event::Jump, plan.clock_jumps));
    events.extend(std::iter::repeat_n(Event::DbStep, plan.db_clock_steps));
    events.shuffle(rng);
    let mut db_offsets = plan.db_offsets.iter().cycle();
    let mut db_offset = None;
    let lease = Duration::from_millis(plan.lease_ms);
    let mut injected_stale = !plan.inject_stale_completion;
    for event in events {
        injected.exits += fleet.supervise(ledger).await?;
        *stale_accepted += stale_probe(storage, injected).await;
        if !injected_stale {
            injected_stale = inject_stale(store, storage, ledger, injected).await?;
        }
        let index = rng.random_range(0..plan.workers.max(1));
        match event {
            Event::Kill => {
                // Every worker may have just died by itself: replace, then kill.
                while fleet.kill9(index, ledger).await?.is_none() {
                    injected.exits += fleet.supervise(ledger).await?;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                injected.kills += 1;
                tokio::time::sleep(Duration::from_millis(rng.random_range(50..1000))).await;
            }
            Event::Restart => {
                let down = Duration::from_millis(rng.random_range(200..1500));
                let fault = ledger
                    .fault("db_restart", None, "crash and restart")
                    .await?;
                match (store.pg.as_mut(), store.mariadb.as_mut()) {
                    (Some(pg), _) => {
                        tokio::task::block_in_place(|| pg.restart_immediate(down))?;
                    }
                    (_, Some(db)) => tokio::task::block_in_place(|| db.kill_restart(down))?,
                    _ => anyhow::bail!("restarts need a database server"),
                }
                ledger.fault_end(fault).await?;
                injected.db_restarts += 1;
                tokio::time::sleep(Duration::from_millis(rng.random_range(1000..4000))).await;
            }
            Event::Proxy => {
                let proxy = proxy.ok_or_else(|| anyhow::anyhow!("no proxy"))?;
                proxy_fault(proxy, rng, ledger, lease, injected).await?;
            }
            Event::Pause => {
                // Past the lease, past the reaper's next pass, so another worker reclaims.
                while fleet
                    .pause(index, lease * 2 + lease / 2, ledger)
                    .await?
                    .is_none()
                {
                    injected.exits += fleet.supervise(ledger).await?;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                injected.pauses += 1;
                tokio::time::sleep(Duration::from_millis(rng.random_range(100..600))).await;
            }
            Event::Jump => {
                let offset = plan
                    .skews
                    .get(rng.random_range(0..plan.skews.len().max(1)))
                    .ok_or_else(|| anyhow::anyhow!("clock jumps need skews"))?;
                while fleet.jump_clock(index, offset, ledger).await?.is_none() {
                    injected.exits += fleet.supervise(ledger).await?;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                injected.clock_jumps += 1;
                tokio::time::sleep(Duration::from_millis(rng.random_range(100..800))).await;
            }
            Event::DbStep => {
                let offset = db_offsets
                    .next()
                    .ok_or_else(|| anyhow::anyhow!("database clock steps need offsets"))?;
                step_db_clock(store, ledger, offset).await?;
                db_offset = Some(offset);
                injected.db_clock_steps += 1;
                // Long enough for a reaper to see the step and hold, and for leases
                // granted before it to run out.
                tokio::time::sleep(lease + Duration::from_millis(rng.random_range(0..2000))).await;
            }
            Event::Term => {
                let clean = loop {
                    match fleet
                        .terminate(index, Duration::from_secs(2), ledger)
                        .await?
                    {
                        Some((_, clean)) => break clean,
                        None => {
                            injected.exits += fleet.supervise(ledger).await?;
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                };
                injected.terms += 1;
                if !clean {
                    injected.terms_unclean += 1;
                }
                tokio::time::sleep(Duration::from_millis(rng.random_range(50..500))).await;
            }
        }
    }
    // Every task given a run time while the clock was ahead is due once it is that far
    // ahead again (otherwise a step back would keep it waiting the step's length).
    let ahead = plan
        .db_offsets
        .iter()
        .max_by_key(|o| crate::check::offset_us(o).unwrap_or(i64::MIN));
    if let (Some(current), Some(ahead)) = (db_offset, ahead) {
        if current != ahead {
            step_db_clock(store, ledger, ahead).await?;
            injected.db_clock_steps += 1;
        }
    }
    Ok(())
}

/// Steps the database server's clock to `offset` from real time, logged as a fault
/// whose detail is the offset.
async fn step_db_clock(store: &Store, ledger: &Ledger, offset: &str) -> anyhow::Result<()> {
    let clock = store.clock.as_ref().ok_or_else(|| {
        anyhow::anyhow!("database clock steps need a server on a clock of its own")
    })?;
    anyhow::ensure!(
        crate::check::offset_us(offset).is_some(),
        "not a clock offset: {offset:?}"
    );
    let fault = ledger.fault("db_clock_step", None, offset).await?;
    clock.set(offset)?;
    ledger.fault_end(fault).await?;
    Ok(())
}

async fn proxy_fault(
    proxy: &FaultProxy,
    rng: &mut StdRng,
    ledger: &Ledger,
    lease: Duration,
    injected: &mut Injected,
) -> anyhow::Result<()> {
    match rng.random_range(0..10) {
        0..=3 => {
            ledger
                .fault("proxy_reset", None, "every connection closed")
                .await?;
            proxy.reset();
            injected.proxy_resets += 1;
        }
        4 => {
            // Longer than the lease: the workers must fence themselves.
            let fault = ledger
                .fault("proxy_blackhole", None, "nothing forwarded")
                .await?;
            proxy.set_mode(Mode::Blackhole);
            tokio::time::sleep(lease + lease / 2).await;
            proxy.reset();
            proxy.set_mode(Mode::Pass);
            ledger.fault_end(fault).await?;
            injected.proxy_blackholes += 1;
        }
        5..=6 => {
            let ms = rng.random_range(20..300);
            let fault = ledger
                .fault("proxy_latency", None, &format!("+{ms} ms per chunk"))
                .await?;
            proxy.set_mode(Mode::Latency(ms));
            tokio::time::sleep(Duration::from_millis(rng.random_range(500..1500))).await;
            proxy.set_mode(Mode::Pass);
            ledger.fault_end(fault).await?;
            injected.proxy_latency += 1;
        }
        _ => {
            let fault = ledger
                .fault("proxy_commit_cut", None, "reply to the next COMMIT dropped")
                .await?;
            proxy.arm_drop_commit_reply();
            let deadline = Instant::now() + Duration::from_secs(3);
            while proxy.commit_cut_pending() && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            // Let the cut connection be torn down before the fault ends.
            tokio::time::sleep(Duration::from_millis(300)).await;
            ledger.fault_end(fault).await?;
        }
    }
    tokio::time::sleep(Duration::from_millis(rng.random_range(100..600))).await;
    Ok(())
}

/// Try to complete running tasks under their previous epoch through the store's own
/// API: every such write must be rejected. Returns how many took effect.
async fn stale_probe(storage: &Arc<dyn Storage>, injected: &mut Injected) -> usize {
    let Ok(running) = storage
        .task_list(&TaskListParams {
            status: Some(TaskStatus::Running),
            limit: 20,
            ..Default::default()
        })
        .await
    else {
        return 0;
    };
    let mut accepted = 0;
    for task in running.iter().filter(|t| t.lease_epoch > 1) {
        injected.stale_probes += 1;
        let stale = TaskCompleteParams {
            lease: Lease {
                id: task.id,
                epoch: task.lease_epoch - 1,
            },
            result: Some("\"stale\"".into()),
            compensation: CompensationState::None,
            now: None,
        };
        if let Ok(true) = storage.task_complete_if_leased(&stale).await {
            accepted += 1;
        }
    }
    accepted
}

/// The checker's self-test: complete one running task under its previous epoch with a
/// write that skips the lease guard (straight SQL on the SQLite file, as a completion
/// without `lease_epoch = ?` in its `WHERE` would). Returns whether it was written.
async fn inject_stale(
    store: &Store,
    storage: &Arc<dyn Storage>,
    ledger: &Ledger,
    injected: &mut Injected,
) -> anyhow::Result<bool> {
    anyhow::ensure!(
        store.pg.is_none(),
        "the stale-completion injection is written for SQLite"
    );
    let running = storage
        .task_list(&TaskListParams {
            status: Some(TaskStatus::Running),
            limit: 50,
            ..Default::default()
        })
        .await?;
    let Some(task) = running.iter().find(|t| t.lease_epoch > 1) else {
        return Ok(false);
    };
    let written =
        crate::broken::stale_completion(&store.direct_url, task.id.0, task.lease_epoch - 1).await?;
    if written {
        ledger
            .fault(
                "stale_injection",
                None,
                &format!("{} epoch {}", task.task_no, task.lease_epoch - 1),
            )
            .await?;
        injected.stale_injections += 1;
    }
    Ok(written)
}
