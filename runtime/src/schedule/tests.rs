//! The core's rules on dates of three time zones whose daylight saving differs (New York: an
//! hour at 02:00; Berlin: an hour at 02:00 and 03:00; Lord Howe: half an hour), the refusals of
//! bad expressions, and the planner's catch-up and overlap decisions on a clock the test moves.

use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};

use super::plan::SCAN_LIMIT;
use super::*;

fn utc(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
}

fn timing(cron: &str, zone: &str) -> Timing {
    Timing { cron: CronSpec::parse(cron).unwrap(), zone: Zone::parse(zone).unwrap(), overlap: Overlap::Skip, catchup: Catchup::None }
}

/// Every fire in [from, to), as UTC text.
fn fires(t: &Timing, from: &str, to: &str) -> Vec<String> {
    let (mut at, to) = (utc(from) - chrono::Duration::seconds(1), utc(to));
    let mut out = Vec::new();
    while let Some(next) = t.next_after(at).filter(|n| *n < to) {
        out.push(fire_time_text(next));
        at = next;
    }
    out
}

#[test]
fn new_york_spring_forward_fires_a_skipped_time_once_after_the_gap_and_fall_back_once_at_the_first() {
    let daily = timing("30 2 * * *", "America/New_York");
    // 8 March 2026: 02:00 EST becomes 03:00 EDT; 02:30 does not exist: 03:00 EDT, once.
    assert_eq!(fires(&daily, "2026-03-07T12:00:00Z", "2026-03-09T12:00:00Z"), ["2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"]);
    // 1 November 2026: 02:00 EDT becomes 01:00 EST; 01:30 happens twice: the first (EDT) only.
    let early = timing("30 1 * * *", "America/New_York");
    assert_eq!(fires(&early, "2026-10-31T12:00:00Z", "2026-11-02T12:00:00Z"), ["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"]);
    // A list of hours: croner would skip 02:15 on the spring-forward day; it fires once at 03:00.
    let listed = timing("15 1,2,3 * * *", "America/New_York");
    assert_eq!(fires(&listed, "2026-03-08T00:00:00Z", "2026-03-08T12:00:00Z"), ["2026-03-08T06:15:00Z", "2026-03-08T07:00:00Z", "2026-03-08T07:15:00Z"]);
    assert_eq!(listed.cron.previous_before(listed.zone, utc("2026-03-08T07:15:00Z")), Some(utc("2026-03-08T07:00:00Z")));
    // An interval: each wall-clock time once too (the repeated hour's second pass is dropped).
    let half_hourly = timing("*/30 * * * *", "America/New_York");
    assert_eq!(
        fires(&half_hourly, "2026-11-01T04:00:00Z", "2026-11-01T08:00:00Z"),
        ["2026-11-01T04:00:00Z", "2026-11-01T04:30:00Z", "2026-11-01T05:00:00Z", "2026-11-01T05:30:00Z", "2026-11-01T07:00:00Z", "2026-11-01T07:30:00Z"]
    );
}

#[test]
fn berlin_skipped_and_repeated_times_fire_once_and_the_hour_before_the_gap_is_untouched() {
    let daily = timing("30 2 * * *", "Europe/Berlin");
    // 29 March 2026: 02:00 CET becomes 03:00 CEST (01:00 UTC).
    assert_eq!(fires(&daily, "2026-03-28T12:00:00Z", "2026-03-30T12:00:00Z"), ["2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"]);
    // 25 October 2026: 03:00 CEST becomes 02:00 CET; 02:30 CEST (00:30 UTC) only.
    assert_eq!(fires(&daily, "2026-10-24T12:00:00Z", "2026-10-26T12:00:00Z"), ["2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"]);
    // A daily time in the hour before the gap fires once (croner 4.0.3 fixed a second fire).
    let one = timing("0 1 * * *", "Europe/Berlin");
    assert_eq!(fires(&one, "2026-03-28T12:00:00Z", "2026-03-29T12:00:00Z"), ["2026-03-29T00:00:00Z"]);
}

#[test]
fn lord_howe_half_hour_shift_fires_skipped_and_repeated_times_once() {
    // 4 October 2026: 02:00 LHST (+10:30) becomes 02:30 LHDT (+11); 02:15 does not exist.
    let gap = timing("15 2 * * *", "Australia/Lord_Howe");
    assert_eq!(fires(&gap, "2026-10-02T12:00:00Z", "2026-10-04T12:00:00Z"), ["2026-10-02T15:45:00Z", "2026-10-03T15:30:00Z"]);
    // 5 April 2026: 02:00 LHDT becomes 01:30 LHST; 01:45 happens twice: the first (+11).
    let repeat = timing("45 1 * * *", "Australia/Lord_Howe");
    assert_eq!(fires(&repeat, "2026-04-03T12:00:00Z", "2026-04-05T12:00:00Z"), ["2026-04-03T14:45:00Z", "2026-04-04T14:45:00Z"]);
}

#[test]
fn seconds_are_optional_and_bad_expressions_are_refused_with_their_place() {
    let every_ten = timing("*/10 * * * * *", "UTC");
    assert_eq!(fires(&every_ten, "2026-01-01T00:00:00Z", "2026-01-01T00:00:30Z"), ["2026-01-01T00:00:00Z", "2026-01-01T00:00:10Z", "2026-01-01T00:00:20Z"]);
    let seven = CronSpec::parse("0 0 0 1 1 * 2030").unwrap_err();
    assert_eq!(seven, CronError::Fields { fields: 7, column: 13 });
    assert!(seven.to_string().contains("this one has 7 (the extra field starts at column 13)"), "{seven}");
    let hour = CronSpec::parse("0 25 * * *").unwrap_err();
    assert!(matches!(&hour, CronError::Field { field: 2, name: "hour", column: 3, .. }), "{hour:?}");
    assert_eq!(hour.column(), Some(3));
    assert!(matches!(CronSpec::parse("0 0 31 2 *"), Err(CronError::NeverFires { .. })));
    assert!(matches!(CronSpec::parse("* * *"), Err(CronError::Fields { fields: 3, column: 0 })));
    assert!(CronSpec::parse("@daily").is_ok());
    assert!(CronSpec::parse("0 9 * * MON-FRI").is_ok());
    assert_eq!(Zone::parse("Mars/Olympus").unwrap_err().to_string(), "`timezone`: `Mars/Olympus` is not an IANA time zone (such as `Europe/Berlin` or `UTC`)");
    assert_eq!(Catchup::parse("all", None, Some(101)), Err(TimingError::MaxRuns(101)));
    assert_eq!(Catchup::parse("all", None, None), Ok(Catchup::All { window: DEFAULT_CATCHUP_WINDOW, max_runs: 1 }));
}

fn policy(cron: &str, overlap: Overlap, catchup: Catchup) -> Timing {
    Timing { overlap, catchup, ..timing(cron, "UTC") }
}

fn outcomes(p: &Plan) -> Vec<&'static str> {
    p.fires.iter().map(|f| f.decision.outcome()).collect()
}

#[test]
fn an_hour_outage_with_catchup_all_three_runs_the_newest_three_and_records_the_rest_missed() {
    let t = policy("* * * * *", Overlap::AllowAll, Catchup::All { window: Duration::from_secs(7200), max_runs: 3 });
    let cursor = utc("2026-06-01T10:00:00Z");
    let now = utc("2026-06-01T11:00:00.400Z");
    let p = plan(&t, Some(cursor), now, &Live::default());
    assert_eq!(p.fires.len(), 61, "10:00 to 11:00, each minute");
    assert_eq!(p.fires.iter().filter(|f| f.decision == Decision::Start).count(), 3);
    assert_eq!(
        p.fires[58..].iter().map(|f| fire_time_text(f.at)).collect::<Vec<_>>(),
        ["2026-06-01T10:58:00Z", "2026-06-01T10:59:00Z", "2026-06-01T11:00:00Z"]
    );
    assert!(p.fires[..58].iter().all(|f| matches!(f.decision, Decision::Missed { why: MissedWhy::LaterRan { max_runs: 3 } })));
    assert_eq!(p.next, Some(utc("2026-06-01T11:01:00Z")));
    // `none`: only a fire found within the grace runs.
    let none = policy("* * * * *", Overlap::AllowAll, Catchup::None);
    let p = plan(&none, Some(cursor), utc("2026-06-01T11:00:20Z"), &Live::default());
    assert!(outcomes(&p).iter().all(|o| *o == "missed"));
    assert!(p.fires[0].decision.why().unwrap().contains("`catchup` is `none`"));
    // `latest`, with a window of 30 minutes: the newest one runs; the older ones are missed.
    let latest = policy("* * * * *", Overlap::Skip, Catchup::Latest { window: Duration::from_secs(1800) });
    let p = plan(&latest, Some(cursor), now, &Live::default());
    assert_eq!(outcomes(&p).iter().filter(|o| **o == "started").count(), 1);
    assert!(matches!(p.fires[0].decision, Decision::Missed { why: MissedWhy::OutsideWindow { .. } }));
}

#[test]
fn a_day_behind_every_second_is_one_record_for_the_oldest_and_the_scan_limit_one_by_one() {
    let t = policy("* * * * * *", Overlap::AllowAll, Catchup::All { window: Duration::from_secs(86_400), max_runs: 100 });
    let p = plan(&t, Some(utc("2026-06-01T00:00:00Z")), utc("2026-06-02T00:00:00Z"), &Live::default());
    assert_eq!(p.fires.len(), 1 + SCAN_LIMIT);
    assert_eq!(p.fires[0].at, utc("2026-06-01T00:00:00Z"));
    assert!(p.fires[0].decision.why().unwrap().contains("through 2026-06-01T23:56:40Z"), "{:?}", p.fires[0]);
    assert_eq!(p.fires.iter().filter(|f| f.decision == Decision::Start).count(), 100);
}

#[test]
fn each_overlap_policy_with_a_live_run() {
    let at = utc("2026-06-01T10:00:00Z");
    let now = at + chrono::Duration::milliseconds(200);
    let live = Live { run: Some("r1".into()), buffered: false };
    let decide = |overlap, live: &Live| plan(&policy("0 * * * *", overlap, Catchup::None), Some(at), now, live).fires;
    assert!(matches!(&decide(Overlap::Skip, &live)[0].decision, Decision::Skip { why } if why.contains("r1")));
    assert_eq!(decide(Overlap::AllowAll, &live)[0].decision, Decision::Start);
    assert_eq!(decide(Overlap::CancelOther, &live)[0].decision, Decision::CancelAndStart { cancel: "r1".into() });
    assert_eq!(decide(Overlap::BufferOne, &live)[0].decision, Decision::Buffer);
    let waiting = Live { buffered: true, ..live.clone() };
    assert_eq!(decide(Overlap::BufferOne, &waiting)[0].decision.outcome(), "skipped");
    assert_eq!(decide(Overlap::Skip, &Live::default())[0].decision, Decision::Start);
    // Nothing due yet: the cursor stays.
    let p = plan(&policy("0 * * * *", Overlap::Skip, Catchup::None), Some(at), at - chrono::Duration::seconds(1), &live);
    assert_eq!(p, Plan { fires: Vec::new(), next: Some(at) });
    // A catch-up under `skip` starts the first and skips the others; under `cancel_other` the newest.
    let all = Catchup::All { window: Duration::from_secs(86_400), max_runs: 3 };
    let three = |overlap| outcomes(&plan(&policy("0 * * * *", overlap, all), Some(at), at + chrono::Duration::hours(2), &Live::default()));
    assert_eq!(three(Overlap::Skip), ["started", "skipped", "skipped"]);
    assert_eq!(three(Overlap::BufferOne), ["started", "buffered", "skipped"]);
    assert_eq!(three(Overlap::CancelOther), ["skipped", "skipped", "started"]);
    assert_eq!(fire_key("s1", at), "schedule:s1:2026-06-01T10:00:00Z");
    let _ = Utc.timestamp_millis_opt(0);
}
