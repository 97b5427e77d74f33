//! Two experiments compared case by case (`fabric eval compare A B`): which cases got better or
//! worse, which verdicts changed, and where each case's runs diverge, stage by stage, read from
//! their journals (the prompt a stage was asked with, its user message, its value): the same
//! facts a replay compares.

use serde::Serialize;

use super::experiment::{EvalError, experiments, last_report};
use super::report::{CaseReport, Report};
use crate::exec::JournalEntry;
use crate::store::RunStore;

/// What changed from experiment A to experiment B.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    pub a: String,
    pub b: String,
    pub pass_rate_a: f64,
    pub pass_rate_b: f64,
    pub cases: Vec<CaseChange>,
}

impl Comparison {
    /// The cases that passed in A and fail in B.
    pub fn regressions(&self) -> impl Iterator<Item = &CaseChange> {
        self.cases.iter().filter(|c| c.change == Change::Regressed)
    }
}

/// How a case fared from A to B.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    Regressed,
    Fixed,
    StillFailing,
    StillPassing,
    OnlyInA,
    OnlyInB,
}

/// One case from A to B.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CaseChange {
    pub case_id: String,
    pub change: Change,
    /// Evaluators whose verdict on the first run changed: `name: pass → fail`.
    pub verdicts: Vec<String>,
    /// Where the first runs diverge, stage by stage, in the order B ran its stages.
    pub divergence: Vec<String>,
    /// The first stage whose prompt, message or value differs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_stage: Option<String>,
}

/// Compares experiments `a` and `b` of `store` (their last reports, and their first runs' journals).
pub async fn compare(store: &dyn RunStore, a: &str, b: &str) -> Result<Comparison, EvalError> {
    experiments(store)?;
    let (ra, rb) = (last_report(store, a).await?, last_report(store, b).await?);
    let mut ids: Vec<&str> = ra.cases.iter().chain(&rb.cases).map(|c| c.case_id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    let mut cases = Vec::new();
    for id in ids {
        let (ca, cb) = (case(&ra, id), case(&rb, id));
        let change = match (ca, cb) {
            (Some(x), Some(y)) => match (x.passed, y.passed) {
                (true, false) => Change::Regressed,
                (false, true) => Change::Fixed,
                (false, false) => Change::StillFailing,
                (true, true) => Change::StillPassing,
            },
            (Some(_), None) => Change::OnlyInA,
            _ => Change::OnlyInB,
        };
        let mut out = CaseChange { case_id: id.to_owned(), change, verdicts: Vec::new(), divergence: Vec::new(), first_stage: None };
        if let (Some(x), Some(y)) = (ca.and_then(|c| c.runs.first()), cb.and_then(|c| c.runs.first())) {
            for v in &y.verdicts {
                if let Some(w) = x.verdicts.iter().find(|w| w.evaluator == v.evaluator)
                    && w.pass != v.pass
                {
                    out.verdicts.push(format!("{}: {} → {}", v.evaluator, word(w.pass), word(v.pass)));
                }
            }
            let (ja, jb) = (store.journal(&x.run_id).await?, store.journal(&y.run_id).await?);
            let diverged = divergence(&ja, &jb);
            out.first_stage = diverged.first().map(|(stage, _)| stage.clone());
            out.divergence = diverged.into_iter().map(|(_, what)| what).collect();
        }
        cases.push(out);
    }
    Ok(Comparison { a: a.to_owned(), b: b.to_owned(), pass_rate_a: ra.pass_rate, pass_rate_b: rb.pass_rate, cases })
}

fn case<'r>(report: &'r Report, id: &str) -> Option<&'r CaseReport> {
    report.cases.iter().find(|c| c.case_id == id)
}

fn word(pass: bool) -> &'static str {
    if pass { "pass" } else { "fail" }
}

/// What a stage was asked and gave in one journal: (stage, system, user, value), in order.
type StageFacts = Vec<(String, Option<String>, Option<String>, Option<String>)>;

fn facts(journal: &[JournalEntry]) -> StageFacts {
    fn at(out: &mut StageFacts, stage: &str) -> usize {
        out.iter().position(|f| f.0 == stage).unwrap_or_else(|| {
            out.push((stage.to_owned(), None, None, None));
            out.len() - 1
        })
    }
    let mut out: StageFacts = Vec::new();
    for entry in journal {
        match entry {
            JournalEntry::ModelReply { stage_id, turn: 0, system, user, .. } => {
                let i = at(&mut out, stage_id);
                out[i].1 = Some(system.clone());
                out[i].2 = Some(user.clone());
            }
            JournalEntry::StageCompleted { stage_id, value, .. } => {
                let i = at(&mut out, stage_id);
                out[i].3 = Some(value.clone());
            }
            _ => {}
        }
    }
    out
}

/// Where journal `b` diverges from journal `a`, stage by stage (in `b`'s order, then the stages
/// only `a` has): (stage, what differs).
pub fn divergence(a: &[JournalEntry], b: &[JournalEntry]) -> Vec<(String, String)> {
    let (fa, fb) = (facts(a), facts(b));
    let mut out = Vec::new();
    for (stage, system, user, value) in &fb {
        let Some((_, was_system, was_user, was_value)) = fa.iter().find(|f| &f.0 == stage) else {
            out.push((stage.clone(), format!("stage `{stage}` ran only in B")));
            continue;
        };
        if was_system != system {
            out.push((stage.clone(), format!("stage `{stage}`: the prompt differs")));
        }
        if was_user != user {
            out.push((stage.clone(), format!("stage `{stage}`: the user message differs")));
        }
        if was_value != value {
            let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "nothing".into());
            out.push((stage.clone(), format!("stage `{stage}`: the value differs: A {}, B {}", show(was_value), show(value))));
        }
    }
    for (stage, ..) in fa.iter().filter(|f| !fb.iter().any(|g| g.0 == f.0)) {
        out.push((stage.clone(), format!("stage `{stage}` ran only in A")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(stage: &str, system: &str, value: &str) -> [JournalEntry; 2] {
        [
            JournalEntry::ModelReply {
                stage_id: stage.into(),
                turn: 0,
                system: system.into(),
                user: "u".into(),
                raw: value.into(),
                value: value.into(),
                model: None,
            },
            JournalEntry::StageCompleted { stage_id: stage.into(), value: value.into(), note: None },
        ]
    }

    #[test]
    fn the_first_stage_that_differs_is_named() {
        let a: Vec<JournalEntry> = [reply("intake", "classify", "billing"), reply("answer", "be brief", "Refunded.")].concat();
        let b: Vec<JournalEntry> = [reply("intake", "classify", "billing"), reply("answer", "be kind", "Sorry, refunded.")].concat();
        let d = divergence(&a, &b);
        assert_eq!(d.first().map(|x| x.0.as_str()), Some("answer"));
        let what: Vec<&str> = d.iter().map(|x| x.1.as_str()).collect();
        assert_eq!(what, ["stage `answer`: the prompt differs", "stage `answer`: the value differs: A Refunded., B Sorry, refunded."]);
        assert!(divergence(&a, &a).is_empty());
        assert_eq!(divergence(&a, &a[..2]), [("answer".to_owned(), "stage `answer` ran only in A".to_owned())]);
    }
}
