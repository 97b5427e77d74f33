//! What the writer writes: a [`Write`] (a new run's row, or a claimed run's batch, serialised
//! by the run that hands it over as [`Prepared`] rows), the [`Rows`] one transaction's jobs
//! become, table by table, and the [`WriteRows`] port each database writes them through
//! ([`super::pool_writer`] on any sqlx pool, [`super::sqlite_writer`] on a SQLite file).

use std::collections::HashSet;

use tokio::sync::oneshot;

use super::prompts::{self, Known, Prompt, StoredEntry};
use super::{Lease, StoreError, StoredStatus, now};
use crate::exec::{JournalBatch, RunStatus};
use crate::failure::BoxFuture;

/// What the writer does: a new run's row (claimed by `owner` for `lease_ms`, or queued), or a
/// claimed run's commit.
pub(crate) enum Write {
    /// With a `key` (an idempotency key), the row is written only when no run has that key.
    Create {
        run_id: String,
        route_id: String,
        request: String,
        claim: Option<(String, i64)>,
        key: Option<String>,
        /// Where the run's ends are posted (`runs.webhook_url`).
        webhook: Option<String>,
        session: Option<String>,
        /// The catalogue version it starts on (`runs.catalogue_version`).
        version: Option<String>,
    },
    Commit {
        lease: Lease,
        batch: Box<Prepared>,
    },
}

/// A batch as rows: serialized by the run that hands it over (on its own thread), so the
/// writer, which every run shares, only writes.
pub(crate) struct Prepared {
    /// (seq, kind, body).
    events: Vec<(i64, &'static str, String)>,
    entries: Vec<StoredEntry>,
    pub(super) end: Option<PreparedEnd>,
}

pub(crate) struct PreparedEnd {
    pub status: StoredStatus,
    pub result: String,
    pub reason_class: Option<&'static str>,
    pub question: Option<String>,
    /// One past the last event written, when the batch has events.
    pub next_seq: Option<i64>,
}

impl Prepared {
    pub(super) fn of(batch: JournalBatch) -> Prepared {
        let events = batch
            .events
            .iter()
            .map(|e| {
                let mut body = Vec::with_capacity(256);
                e.write_json_line(&mut body);
                body.pop();
                (e.seq as i64, e.kind.as_str(), String::from_utf8(body).unwrap_or_default())
            })
            .collect();
        // A model reply's system prompt goes to its own row, once per prompt (`super::prompts`).
        let entries = batch.entries.iter().map(prompts::split).collect();
        // Between stages only the next `seq` changes, and the events' rows already say it.
        let end = batch.end.as_ref().map(|result| PreparedEnd {
            status: match result.status() {
                RunStatus::Completed => StoredStatus::Completed,
                RunStatus::Failed => StoredStatus::Failed,
                RunStatus::AwaitingInput => StoredStatus::AwaitingInput,
                RunStatus::Cancelled => StoredStatus::Cancelled,
            },
            result: serde_json::to_string(result).unwrap_or_default(),
            reason_class: result.error().map(|e| e.reason_class.as_str()),
            // A copy for people reading the table (the result holds the question exactly, JSON
            // escaped): PostgreSQL's text cannot hold NUL, so it is shown as U+FFFD there.
            question: result.question().map(|q| q.replace('\0', "\u{FFFD}")),
            next_seq: batch.events.last().map(|e| e.seq as i64 + 1),
        });
        Prepared { events, entries, end }
    }
}

impl Write {
    /// A new run's row, claimed by `holder` or queued, with its idempotency key.
    pub(crate) fn create(run: &super::NewRun<'_>, holder: Option<&super::Holder>, key: Option<&super::IdempotencyKey>) -> Write {
        Write::Create {
            run_id: run.run_id.to_owned(),
            route_id: run.route_id.to_owned(),
            request: run.request_json(),
            claim: holder.map(|h| (h.owner.clone(), h.lease_ms())),
            key: key.map(|k| k.as_str().to_owned()),
            webhook: run.webhook.map(str::to_owned),
            session: run.session_id.map(str::to_owned),
            version: run.catalogue_version.map(|v| v.as_str().to_owned()),
        }
    }

    pub(super) fn run_id(&self) -> &str {
        match self {
            Write::Create { run_id, .. } => run_id,
            Write::Commit { lease, .. } => lease.run_id(),
        }
    }
}

/// A job, and who waits for it (appends are not waited for).
pub(super) type Job = (Write, Option<oneshot::Sender<Result<(), StoreError>>>);

/// A run's end as its row takes it: the prepared end, with the lease that writes it.
pub(crate) struct End<'a> {
    pub run_id: &'a str,
    pub token: i64,
    pub end: &'a PreparedEnd,
}

/// A new run's row.
pub(crate) struct Create<'a> {
    pub run_id: &'a str,
    pub route_id: &'a str,
    pub request: &'a str,
    /// Claimed by (owner, lease_ms), or queued.
    pub claim: Option<(&'a str, i64)>,
    pub key: Option<&'a str>,
    pub webhook: Option<&'a str>,
    pub session: Option<&'a str>,
    pub version: Option<&'a str>,
}

/// What one transaction writes, table by table, in the order the jobs came.
pub(crate) struct Rows<'a> {
    /// The time the rows are stamped with.
    pub at: String,
    pub creates: Vec<Create<'a>>,
    /// The leases of the runs this transaction commits for: the fence.
    pub leases: Vec<(&'a str, i64)>,
    /// (run_id, seq, kind, body).
    pub events: Vec<(&'a str, i64, &'a str, &'a str)>,
    /// (run_id, entry, the digest of the prompt it names).
    pub entries: Vec<(&'a str, &'a str, Option<&'a str>)>,
    /// (run_id, prompt): the prompts the entries name, for the runs that hold their lease, in
    /// the order of their digests (PostgreSQL writers inserting the same new keys in one order
    /// never wait for each other in a cycle).
    pub prompts: Vec<(&'a str, &'a Prompt)>,
    pub ends: Vec<End<'a>>,
}

impl<'a> Rows<'a> {
    pub(super) fn of(jobs: &'a [Job]) -> Rows<'a> {
        let mut rows =
            Rows { at: now(), creates: Vec::new(), leases: Vec::new(), events: Vec::new(), entries: Vec::new(), prompts: Vec::new(), ends: Vec::new() };
        let mut seen = HashSet::new();
        for (job, _) in jobs {
            match job {
                Write::Create { run_id, route_id, request, claim, key, webhook, session, version } => rows.creates.push(Create {
                    run_id,
                    route_id,
                    request,
                    claim: claim.as_ref().map(|(o, ms)| (o.as_str(), *ms)),
                    key: key.as_deref(),
                    webhook: webhook.as_deref(),
                    session: session.as_deref(),
                    version: version.as_deref(),
                }),
                Write::Commit { lease, batch } => {
                    let run_id = lease.run_id();
                    if seen.insert((run_id, lease.token())) {
                        rows.leases.push((run_id, lease.token()));
                    }
                    rows.events.extend(batch.events.iter().map(|(seq, kind, body)| (run_id, *seq, *kind, body.as_str())));
                    for e in &batch.entries {
                        rows.entries.push((run_id, e.json.as_str(), e.prompt.as_ref().map(|p| p.digest.as_str())));
                        if let Some(p) = &e.prompt {
                            rows.prompts.push((run_id, p));
                        }
                    }
                    if let Some(end) = &batch.end {
                        rows.ends.push(End { run_id, token: lease.token(), end });
                    }
                }
            }
        }
        rows.prompts.sort_unstable_by(|a, b| a.1.digest.cmp(&b.1.digest));
        rows
    }

    /// The prompts to write for the runs in `holding`, each once, leaving out those `known`.
    pub fn new_prompts(&self, holding: &HashSet<&str>, known: &Known) -> Vec<&'a Prompt> {
        let mut new: Vec<&Prompt> = self.prompts.iter().filter(|(run, p)| holding.contains(run) && !known.has(&p.digest)).map(|(_, p)| *p).collect();
        // Sorted already: equal ones are neighbours.
        new.dedup_by(|a, b| a.digest == b.digest);
        new
    }

    /// The task state changes of the runs in `holding` an A2A push config is told of (issue 52):
    /// `running` for a run that started or resumed here (a stream's `working`), then each end
    /// or question, in that order. The writers add one outbox row per config of the run for
    /// each, in this transaction.
    pub fn push_changes(&self, holding: &HashSet<&str>) -> Vec<PushChange<'a>> {
        let mut changes: Vec<PushChange<'a>> = Vec::new();
        for (run_id, _, kind, _) in &self.events {
            if matches!(*kind, "run.started" | "run.resumed") && holding.contains(run_id) && !changes.iter().any(|c| c.run_id == *run_id) {
                changes.push(PushChange { run_id, status: "running", result: None, reason_class: None, question: None });
            }
        }
        for e in self.ends.iter().filter(|e| holding.contains(e.run_id)) {
            let end = e.end;
            changes.push(PushChange {
                run_id: e.run_id,
                status: end.status.as_str(),
                result: Some(end.result.as_str()),
                reason_class: end.reason_class,
                question: end.question.as_deref(),
            });
        }
        changes
    }
}

/// A status change of a run as its push configs' outbox rows hold it.
pub(crate) struct PushChange<'a> {
    pub run_id: &'a str,
    pub status: &'static str,
    pub result: Option<&'a str>,
    pub reason_class: Option<&'static str>,
    pub question: Option<&'a str>,
}

/// How one database writes a transaction's rows (all of them, or none): the rows of runs that
/// hold their lease; the ids of those that do not (fenced) are returned, and so are those of
/// new runs whose idempotency key another run has (not written either).
pub(crate) trait WriteRows: Send + Sync + 'static {
    fn write_rows<'a>(&'a self, rows: &'a Rows<'a>) -> BoxFuture<'a, Result<HashSet<String>, WriteFailure>>;
    /// Whether the transaction of `rows` committed after all (its connection broke before it
    /// heard), and then which of its runs are fenced now: the rows of a run still holding its
    /// lease were written by this writer alone, so the first of them says.
    fn committed<'a>(&'a self, rows: &'a Rows<'a>) -> BoxFuture<'a, Result<Option<HashSet<String>>, StoreError>>;
}

/// A transaction that failed, and whether it may have committed all the same (its connection
/// broke while the COMMIT was on its way: only the database knows now).
#[derive(Debug)]
pub(crate) struct WriteFailure {
    pub error: StoreError,
    pub in_doubt: bool,
}

impl WriteFailure {
    pub(super) fn before_commit(error: StoreError) -> WriteFailure {
        WriteFailure { error, in_doubt: false }
    }
}
