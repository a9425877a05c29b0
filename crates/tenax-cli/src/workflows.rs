//! `tenax workflows ...`: list workflows and show one with its tasks.
use clap::Subcommand;
use comfy_table::Table;
use tenax::storage::{WorkflowListParams, WorkflowRecord};
use tenax::Client;

#[derive(Debug, Subcommand)]
pub(crate) enum WorkflowsCommand {
    /// List workflows, newest first, with their state and task counts.
    List {
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Only workflows with an id below this one (the next page).
        #[arg(long, value_name = "ID")]
        before: Option<i64>,
    },
    /// Show a workflow: its state, and each task with its status and parents.
    Show {
        /// Workflow id.
        id: i64,
    },
}

fn counts(workflow: &WorkflowRecord) -> String {
    workflow
        .by_status
        .iter()
        .map(|(status, n)| format!("{n} {status}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn time(t: Option<chrono::DateTime<chrono::Utc>>) -> String {
    t.map_or_else(
        || "-".to_owned(),
        |t| t.format("%Y-%m-%d %H:%M:%S").to_string(),
    )
}

pub(crate) async fn run(client: &Client, command: WorkflowsCommand) -> anyhow::Result<()> {
    match command {
        WorkflowsCommand::List { limit, before } => {
            let workflows = client
                .workflows(&WorkflowListParams {
                    before_id: before,
                    limit,
                })
                .await?;
            let mut table = Table::new();
            table.set_header([
                "id", "name", "kind", "state", "tasks", "created", "finished",
            ]);
            for w in &workflows {
                table.add_row([
                    w.id.to_string(),
                    w.name.clone(),
                    w.kind.as_str().to_owned(),
                    w.state.to_string(),
                    counts(w),
                    time(Some(w.created_at)),
                    time(w.finished_at),
                ]);
            }
            println!("{table}");
            println!("{} workflow(s)", workflows.len());
        }
        WorkflowsCommand::Show { id } => {
            let Some(detail) = client.workflow(id).await? else {
                anyhow::bail!("workflow {id} not found");
            };
            let w = &detail.workflow;
            println!(
                "workflow {} {:?}: {} {} ({}), policy {}, created {}, finished {}",
                w.id,
                w.name,
                w.kind.as_str(),
                w.state,
                counts(w),
                w.policy.as_str(),
                time(Some(w.created_at)),
                time(w.finished_at)
            );
            let mut table = Table::new();
            table.set_header([
                "key",
                "task",
                "task_no",
                "type",
                "status",
                "parents",
                "compensation",
            ]);
            for t in &detail.tasks {
                table.add_row([
                    t.key.clone(),
                    t.task.id.to_string(),
                    t.task.task_no.to_string(),
                    t.task.command_type.clone(),
                    t.task.status.to_string(),
                    if t.parents.is_empty() {
                        "-".to_owned()
                    } else {
                        t.parents.join(", ")
                    },
                    t.task
                        .compensation
                        .map_or_else(|| "-".to_owned(), |c| c.as_str().to_owned()),
                ]);
            }
            println!("{table}");
        }
    }
    Ok(())
}
