//! Evaluations over datasets (issue 51): a [`Dataset`] of cases (a route, a goal, what is
//! expected), [`Evaluator`]s decoded once from it, and grading: pure functions of a run's
//! record ([`RunRecord`]) into [`Verdict`]s, so that recorded runs are graded again for zero
//! tokens.
//!
//! `dataset` (files → cases, every problem located), `interop` (pydantic_evals' and LangSmith's
//! datasets, read and written), `harvest` (a dataset from recorded runs), `evaluator` (the kinds, their decoding),
//! `grade` (the checks), `judge` (`llm_judge`: a model profile's verdict, kept per run and judge), `check` (a dataset against the runtime it runs on, before any run),
//! `experiment` (cases run through a [`crate::runtime::Durable`], recorded and tagged; regraded
//! from the store), `report` (pass rates, spread, the CI gate, JUnit XML), `html` (the report as a page), `rerun` (a case run again from the first stage that changed, the stages before from the
//! journal), `compare` (two experiments case by
//! case, with where their runs' journals diverge).

mod check;
mod compare;
mod dataset;
mod evaluator;
mod experiment;
mod grade;
mod harvest;
mod html;
mod interop;
mod judge;
mod report;
mod rerun;

pub use check::check;
pub use compare::{CaseChange, Change, Comparison, compare, divergence};
pub use dataset::{Case, CaseAt, Dataset, DatasetError, Expected, MAX_DATASET_BYTES, RouteEvaluators};
pub use evaluator::{Check, Evaluator, JsonPath};
pub use experiment::{EvalError, RunOptions, experiments, last_report, record_of, regrade, run, stored};
pub use grade::{RunRecord, Verdict, as_json, grade};
pub use harvest::from_runs;
pub use html::html;
pub use interop::{to_fabric_yaml, to_langsmith_json, to_pydantic_yaml};
pub use judge::{JUDGE_ROUTE, judge_key};
pub use report::{CaseReport, EvaluatorSummary, Gate, GateFindings, Report, RunReport, ScoreSpread, Spread, junit, regressions};
pub use rerun::rerun;
