//! Evaluations over datasets (issue 51): a [`Dataset`] of cases (a route, a goal, what is
//! expected), [`Evaluator`]s decoded once from it, and grading: pure functions of a run's
//! record ([`RunRecord`]) into [`Verdict`]s, so that recorded runs are graded again for zero
//! tokens.
//!
//! `dataset` (files → cases, every problem located), `evaluator` (the kinds, their decoding),
//! `grade` (the checks).

mod dataset;
mod evaluator;
mod grade;

pub use dataset::{Case, CaseAt, Dataset, DatasetError, Expected, MAX_DATASET_BYTES};
pub use evaluator::{Check, Evaluator, JsonPath};
pub use grade::{RunRecord, Verdict, as_json, grade};
