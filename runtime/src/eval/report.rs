//! An experiment's report: per case and evaluator the verdicts of every repeat, pass rates,
//! scores, latency and tokens, the spread across repeats; the summary per evaluator; the CI gate
//! ([`Gate`]) against a threshold and a baseline; JUnit XML.

use serde::{Deserialize, Serialize};

use super::dataset::Dataset;
use super::grade::{RunRecord, Verdict, grade};
use crate::svg::escape as esc;

/// A graded experiment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Report {
    pub experiment_id: String,
    pub name: String,
    pub dataset: String,
    /// Cases whose every run passed every evaluator, over all cases.
    pub pass_rate: f64,
    pub cases_passed: usize,
    pub cases_total: usize,
    pub evaluators: Vec<EvaluatorSummary>,
    /// Failing cases first, then by id.
    pub cases: Vec<CaseReport>,
    pub runs: usize,
    pub tokens: u64,
    /// Model calls made by the runs (not those taken from a journal).
    pub llm_calls: u64,
    pub mean_duration_ms: Option<f64>,
    /// Judges asked by this grading (a verdict kept from an earlier one costs none).
    #[serde(default)]
    pub judge_calls: u32,
    #[serde(default)]
    pub judge_tokens: u64,
}

/// One evaluator over every run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EvaluatorSummary {
    pub name: String,
    pub passed: usize,
    pub graded: usize,
    pub pass_rate: f64,
    pub mean_score: f64,
}

/// One case over its repeats.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CaseReport {
    pub case_id: String,
    pub route_id: String,
    /// Every run passed every evaluator.
    pub passed: bool,
    /// Runs that passed every evaluator, over its runs.
    pub pass_rate: f64,
    /// Verdicts that differ between repeats (the evaluators whose verdicts did).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flaky: Vec<String>,
    /// With repeats: how the runs spread (none for a case run once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spread: Option<Spread>,
    pub runs: Vec<RunReport>,
}

/// How a case's repeats spread: latency, tokens, and each evaluator's verdicts and scores.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Spread {
    pub min_duration_ms: Option<f64>,
    pub max_duration_ms: Option<f64>,
    pub min_tokens: u64,
    pub max_tokens: u64,
    pub evaluators: Vec<ScoreSpread>,
}

/// One evaluator over a case's repeats.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ScoreSpread {
    pub evaluator: String,
    /// Repeats it passed, of `runs`.
    pub passed: usize,
    pub runs: usize,
    pub min_score: f64,
    pub max_score: f64,
    pub mean_score: f64,
}

/// The spread of `runs` (two or more).
fn spread(runs: &[RunReport]) -> Option<Spread> {
    if runs.len() < 2 {
        return None;
    }
    let durations: Vec<f64> = runs.iter().filter_map(|r| r.duration_ms).collect();
    let fold = |f: fn(f64, f64) -> f64| durations.iter().copied().reduce(f);
    let mut evaluators: Vec<ScoreSpread> = Vec::new();
    for v in runs.iter().flat_map(|r| &r.verdicts) {
        match evaluators.iter_mut().find(|s| s.evaluator == v.evaluator) {
            Some(s) => {
                s.passed += usize::from(v.pass);
                s.runs += 1;
                s.min_score = s.min_score.min(v.score);
                s.max_score = s.max_score.max(v.score);
                s.mean_score += v.score;
            }
            None => evaluators.push(ScoreSpread {
                evaluator: v.evaluator.clone(),
                passed: usize::from(v.pass),
                runs: 1,
                min_score: v.score,
                max_score: v.score,
                mean_score: v.score,
            }),
        }
    }
    for s in &mut evaluators {
        s.mean_score /= s.runs as f64;
    }
    Some(Spread {
        min_duration_ms: fold(f64::min),
        max_duration_ms: fold(f64::max),
        min_tokens: runs.iter().map(|r| r.tokens).min().unwrap_or(0),
        max_tokens: runs.iter().map(|r| r.tokens).max().unwrap_or(0),
        evaluators,
    })
}

/// One run of a case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RunReport {
    pub repeat: u32,
    pub run_id: String,
    pub status: String,
    pub passed: bool,
    pub verdicts: Vec<Verdict>,
    pub duration_ms: Option<f64>,
    pub tokens: u64,
    pub llm_calls: u32,
    /// A partial re-run's first live stage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_from: Option<String>,
}

/// A run to report: its case, repeat, record, and where a partial re-run started.
#[derive(Debug, Clone)]
pub struct Graded {
    pub case_id: String,
    pub repeat: u32,
    pub record: RunRecord,
    pub started_from: Option<String>,
    /// Verdicts graded elsewhere (a judge's), added to the pure ones.
    pub extra: Vec<Verdict>,
}

/// Grades every run with the dataset's evaluators (a run of a case the dataset no longer has is
/// left out) into a report.
pub fn build(experiment_id: &str, dataset: &Dataset, runs: Vec<Graded>) -> Report {
    let mut cases: Vec<CaseReport> = Vec::new();
    let mut summaries: Vec<EvaluatorSummary> = Vec::new();
    let (mut tokens, mut llm_calls, mut durations) = (0u64, 0u64, Vec::new());
    let n_runs = runs.len();
    for run in runs {
        let Some(case) = dataset.cases.iter().find(|c| c.id == run.case_id) else { continue };
        let mut verdicts: Vec<Verdict> =
            dataset.evaluators_of(case).filter(|e| !matches!(e.check, super::Check::LlmJudge { .. })).map(|e| grade(e, case, &run.record)).collect();
        verdicts.extend(run.extra);
        for v in &verdicts {
            let s = match summaries.iter_mut().find(|s| s.name == v.evaluator) {
                Some(s) => s,
                None => {
                    summaries.push(EvaluatorSummary { name: v.evaluator.clone(), passed: 0, graded: 0, pass_rate: 0.0, mean_score: 0.0 });
                    summaries.last_mut().expect("just pushed")
                }
            };
            s.graded += 1;
            s.passed += usize::from(v.pass);
            s.mean_score += v.score;
        }
        tokens += run.record.tokens;
        llm_calls += u64::from(run.record.llm_calls);
        durations.extend(run.record.duration_ms);
        let report = RunReport {
            repeat: run.repeat,
            run_id: run.record.run_id.clone(),
            status: run.record.status.clone(),
            passed: run.record.status == "completed" && verdicts.iter().all(|v| v.pass),
            verdicts,
            duration_ms: run.record.duration_ms,
            tokens: run.record.tokens,
            llm_calls: run.record.llm_calls,
            started_from: run.started_from,
        };
        match cases.iter_mut().find(|c| c.case_id == case.id) {
            Some(c) => c.runs.push(report),
            None => cases.push(CaseReport {
                case_id: case.id.clone(),
                route_id: case.route_id.clone(),
                passed: false,
                pass_rate: 0.0,
                flaky: Vec::new(),
                spread: None,
                runs: vec![report],
            }),
        }
    }
    for s in &mut summaries {
        s.pass_rate = ratio(s.passed, s.graded);
        s.mean_score = if s.graded == 0 { 0.0 } else { s.mean_score / s.graded as f64 };
    }
    for c in &mut cases {
        c.runs.sort_by_key(|r| r.repeat);
        let passed = c.runs.iter().filter(|r| r.passed).count();
        c.pass_rate = ratio(passed, c.runs.len());
        c.passed = passed == c.runs.len();
        c.spread = spread(&c.runs);
        let first = &c.runs[0].verdicts;
        c.flaky = first
            .iter()
            .filter(|v| c.runs.iter().any(|r| r.verdicts.iter().find(|w| w.evaluator == v.evaluator).is_some_and(|w| w.pass != v.pass)))
            .map(|v| v.evaluator.clone())
            .collect();
    }
    cases.sort_by(|a, b| (a.passed, &a.case_id).cmp(&(b.passed, &b.case_id)));
    let cases_passed = cases.iter().filter(|c| c.passed).count();
    let mean_duration_ms = (!durations.is_empty()).then(|| durations.iter().sum::<f64>() / durations.len() as f64);
    Report {
        experiment_id: experiment_id.to_owned(),
        name: dataset.name.clone(),
        dataset: dataset.path.display().to_string(),
        pass_rate: ratio(cases_passed, cases.len()),
        cases_passed,
        cases_total: cases.len(),
        evaluators: summaries,
        cases,
        runs: n_runs,
        tokens,
        llm_calls,
        mean_duration_ms,
        judge_calls: 0,
        judge_tokens: 0,
    }
}

fn ratio(n: usize, of: usize) -> f64 {
    if of == 0 { 0.0 } else { n as f64 / of as f64 }
}

/// The CI gate: a least pass rate, and at most so many regressions against a baseline.
#[derive(Debug, Clone, Default)]
pub struct Gate {
    pub min_pass: Option<f64>,
    pub max_regressions: Option<usize>,
}

/// What the gate found: empty when it lets the report through.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct GateFindings {
    /// The pass rate under `--min-pass`, with it.
    pub pass_rate_below: Option<(f64, f64)>,
    /// Cases that passed in the baseline and fail now.
    pub regressions: Vec<String>,
    /// Whether there are more regressions than allowed.
    pub too_many_regressions: bool,
}

impl GateFindings {
    pub fn failed(&self) -> bool {
        self.pass_rate_below.is_some() || self.too_many_regressions
    }
}

impl Gate {
    /// Checks `report` (against `baseline` for regressions).
    pub fn check(&self, report: &Report, baseline: Option<&Report>) -> GateFindings {
        let mut findings = GateFindings::default();
        if let Some(min) = self.min_pass
            && report.pass_rate < min
        {
            findings.pass_rate_below = Some((report.pass_rate, min));
        }
        if let Some(base) = baseline {
            findings.regressions = regressions(base, report);
        }
        findings.too_many_regressions = self.max_regressions.is_some_and(|max| findings.regressions.len() > max);
        findings
    }
}

/// The cases that passed in `base` and do not in `now`.
pub fn regressions(base: &Report, now: &Report) -> Vec<String> {
    let mut out: Vec<String> =
        now.cases.iter().filter(|c| !c.passed && base.cases.iter().any(|b| b.case_id == c.case_id && b.passed)).map(|c| c.case_id.clone()).collect();
    out.sort();
    out
}

/// The report as JUnit XML: one test suite, one test case per case and repeat, a failure per
/// failed verdict (texts escaped as the SVG pictures' are: XML 1.0 character data on one line).
pub fn junit(report: &Report) -> String {
    let runs: Vec<(&CaseReport, &RunReport)> = report.cases.iter().flat_map(|c| c.runs.iter().map(move |r| (c, r))).collect();
    let failures = runs.iter().filter(|(_, r)| !r.passed).count();
    let seconds = |r: &RunReport| r.duration_ms.unwrap_or(0.0) / 1000.0;
    let total: f64 = runs.iter().map(|(_, r)| seconds(r)).sum();
    let mut xml = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    xml.push_str(&format!("<testsuites name=\"{}\" tests=\"{}\" failures=\"{failures}\" errors=\"0\" time=\"{total:.3}\">\n", esc(&report.name), runs.len()));
    xml.push_str(&format!(
        "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{failures}\" errors=\"0\" skipped=\"0\" time=\"{total:.3}\">\n",
        esc(&report.name),
        runs.len()
    ));
    for (case, run) in runs {
        let name = if case.runs.len() > 1 { format!("{} #{}", case.case_id, run.repeat) } else { case.case_id.clone() };
        xml.push_str(&format!("    <testcase name=\"{}\" classname=\"{}\" time=\"{:.3}\">\n", esc(&name), esc(&case.route_id), seconds(run)));
        let failed: Vec<&Verdict> = run.verdicts.iter().filter(|v| !v.pass).collect();
        if !run.passed {
            let message = if failed.is_empty() {
                format!("the run is {}", run.status)
            } else {
                failed.iter().map(|v| v.evaluator.as_str()).collect::<Vec<_>>().join(", ")
            };
            let body: Vec<String> = failed.iter().map(|v| format!("{}: {}", v.evaluator, v.reason)).collect();
            xml.push_str(&format!("      <failure message=\"{}\" type=\"evaluation\">{}</failure>\n", esc(&message), esc(&body.join("; "))));
        }
        xml.push_str(&format!("      <system-out>run {}</system-out>\n", esc(&run.run_id)));
        xml.push_str("    </testcase>\n");
    }
    xml.push_str("  </testsuite>\n</testsuites>\n");
    xml
}
