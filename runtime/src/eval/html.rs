//! An experiment's report as one self-contained HTML page: the summary, the evaluators, and a
//! table of the cases with the failing ones first, each run linking to the run inspector
//! (`/ui/#/runs/{id}` of a `fabric serve` on the same store). Every text is escaped; the page
//! loads nothing.

use super::report::Report;
use crate::svg::escape as esc;

const STYLE: &str = "body{font:14px system-ui,sans-serif;margin:2em;color:#1d1d1f}table{border-collapse:collapse;margin:1em 0}\
td,th{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}th{background:#f3f3f3}\
.fail{color:#b00020;font-weight:600}.pass{color:#0a7d32;font-weight:600}.why{color:#555;font-size:13px}code{font-size:13px}";

/// `report` as HTML; `inspector` is the base URL of the service whose inspector shows the runs
/// (`http://127.0.0.1:8080`).
pub fn html(report: &Report, inspector: &str) -> String {
    let base = inspector.trim_end_matches('/');
    let mut page = format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{name}: {rate:.1}%</title><style>{STYLE}</style></head><body>\n\
         <h1>{name}</h1>\n<p>Experiment <code>{id}</code> of <code>{dataset}</code>: <b>{passed}/{total}</b> cases passed ({rate:.1}%); {runs} runs, \
         {calls} model calls, {tokens} tokens{mean}.</p>\n",
        name = esc(&report.name),
        id = esc(&report.experiment_id),
        dataset = esc(&report.dataset),
        passed = report.cases_passed,
        total = report.cases_total,
        rate = report.pass_rate * 100.0,
        runs = report.runs,
        calls = report.llm_calls,
        tokens = report.tokens,
        mean = report.mean_duration_ms.map(|d| format!(", mean {d:.1} ms")).unwrap_or_default(),
    );
    page.push_str("<table><tr><th>evaluator</th><th>passed</th><th>rate</th><th>mean score</th></tr>\n");
    for e in &report.evaluators {
        page.push_str(&format!(
            "<tr><td>{}</td><td>{}/{}</td><td>{:.1}%</td><td>{:.2}</td></tr>\n",
            esc(&e.name),
            e.passed,
            e.graded,
            e.pass_rate * 100.0,
            e.mean_score
        ));
    }
    page.push_str("</table>\n<table><tr><th>case</th><th>route</th><th>result</th><th>runs</th></tr>\n");
    for case in &report.cases {
        let (class, word) = if case.passed { ("pass", "pass") } else { ("fail", "FAIL") };
        let flaky = if case.flaky.is_empty() { String::new() } else { format!("<div class=\"why\">flaky: {}</div>", esc(&case.flaky.join(", "))) };
        let mut runs = String::new();
        for run in &case.runs {
            let link = format!("{base}/ui/#/runs/{}", run.run_id);
            let from = run.started_from.as_deref().map(|s| format!(", from stage <code>{}</code>", esc(s))).unwrap_or_default();
            runs.push_str(&format!(
                "<div><a href=\"{}\">run #{}</a> {}{from}, {} tokens{}</div>",
                esc(&link),
                run.repeat,
                esc(&run.status),
                run.tokens,
                run.duration_ms.map(|d| format!(", {d:.1} ms")).unwrap_or_default()
            ));
            for v in run.verdicts.iter().filter(|v| !v.pass) {
                runs.push_str(&format!("<div class=\"why\">{}: {}</div>", esc(&v.evaluator), esc(&v.reason)));
            }
        }
        page.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td class=\"{class}\">{word} {:.0}%{flaky}</td><td>{runs}</td></tr>\n",
            esc(&case.case_id),
            esc(&case.route_id),
            case.pass_rate * 100.0
        ));
    }
    page.push_str("</table>\n</body></html>\n");
    page
}
