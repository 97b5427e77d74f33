//! A cron expression, parsed once ([`CronSpec::parse`]), and the fire times it gives in a time
//! zone ([`CronSpec::next_after`], [`CronSpec::previous_before`]) under the daylight-saving rules
//! of docs/operations.md: a wall-clock time a spring-forward day skips fires once, at the first
//! instant after the gap; one a fall-back day repeats fires once, at its first instant.
//!
//! croner parses and steps (5 fields, or 6 with seconds first; no year field); what it leaves to
//! its caller is done here: where in the text a bad expression is wrong (the field, its column),
//! an expression that never fires refused, and the second pass of a repeated wall-clock time of
//! an interval expression (croner fires each pass of `*/15`) dropped.

use chrono::{DateTime, LocalResult, Offset, TimeZone, Utc};
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};

use super::Zone;

/// The names of the fields of a 5-field expression, in order; a 6-field one has `second` first.
const FIELDS: [&str; 5] = ["minute", "hour", "day of month", "month", "day of week"];

/// A fire is looked for this many years ahead at most: an expression with none is refused.
const HORIZON_YEARS: i32 = 8;

/// Why a cron expression is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CronError {
    #[error("a cron expression has 5 fields (minute hour day-of-month month day-of-week) or 6 (a second first); this one has {fields}{}", at_column(*.column))]
    Fields { fields: usize, column: usize },
    #[error("field {field} ({name}) at column {column}: {message}")]
    Field { field: usize, name: &'static str, column: usize, message: String },
    #[error("{message}")]
    Whole { message: String },
    #[error("`{expression}` never fires: no date matches it in the next {HORIZON_YEARS} years (such as the 31st of February)")]
    NeverFires { expression: String },
}

fn at_column(column: usize) -> String {
    if column == 0 { String::new() } else { format!(" (the extra field starts at column {column})") }
}

impl CronError {
    /// The 1-based column where the expression goes wrong, when one field is at fault.
    pub fn column(&self) -> Option<usize> {
        match self {
            CronError::Fields { column, .. } | CronError::Field { column, .. } if *column > 0 => Some(*column),
            _ => None,
        }
    }
}

/// A parsed cron expression: the text as written and croner's reading of it.
#[derive(Debug, Clone)]
pub struct CronSpec {
    text: String,
    cron: Cron,
}

impl PartialEq for CronSpec {
    fn eq(&self, other: &CronSpec) -> bool {
        self.text == other.text
    }
}

fn parser() -> CronParser {
    CronParser::builder().seconds(Seconds::Optional).year(Year::Disallowed).build()
}

impl CronSpec {
    /// Parses `text`: 5 fields, or 6 with seconds first; `@hourly` and the like; names of
    /// months and days. A bad field is named with its column; an expression that matches no
    /// date in the next years is refused ([`CronError::NeverFires`]).
    pub fn parse(text: &str) -> Result<CronSpec, CronError> {
        let text = text.trim();
        let fields = field_columns(text);
        if !text.starts_with('@') && !(5..=6).contains(&fields.len()) {
            let column = fields.get(6).or(fields.get(5)).copied().filter(|_| fields.len() > 6).unwrap_or(0);
            return Err(CronError::Fields { fields: fields.len(), column });
        }
        let cron = parser().parse(text).map_err(|e| locate(text, &fields, &e))?;
        let spec = CronSpec { text: text.to_owned(), cron };
        let start = Utc.with_ymd_and_hms(2000, 1, 1, 0, 0, 0).single().unwrap_or_default();
        let now = super::system_now().max(start);
        let horizon = now.with_timezone(&Utc) + chrono::Duration::days(366 * i64::from(HORIZON_YEARS));
        match spec.next_after(Zone::utc(), now) {
            Some(t) if t <= horizon => Ok(spec),
            _ => Err(CronError::NeverFires { expression: text.to_owned() }),
        }
    }

    /// The expression as written (trimmed).
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The first fire strictly after `after`, in `zone`; `None` when there is none before
    /// croner's horizon (year 5000).
    pub fn next_after(&self, zone: Zone, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let tz = zone.tz();
        // Fires are whole seconds: strictly after `after` is strictly after its second.
        let mut from = whole_second(after).with_timezone(&tz);
        // Each round drops one second pass of a repeated hour; a few suffice.
        for _ in 0..10_000 {
            let t = self.cron.find_next_occurrence(&from, false).ok()?.with_timezone(&Utc);
            // A time the expression names in a spring-forward gap croner skipped (it moves only
            // a fixed time past a gap; `15 1,2,3 * * *` would lose 02:15): the instant after it.
            if let Some(gap) = self.gap_fire(zone, from.with_timezone(&Utc), t).filter(|g| *g < t) {
                return Some(gap);
            }
            if !second_pass(zone, t) {
                return Some(t);
            }
            from = t.with_timezone(&tz);
        }
        None
    }

    /// The instant a spring-forward gap in (`lo`, `hi`] ends at, when the expression names a
    /// wall-clock time inside that gap: the fire of that skipped time.
    fn gap_fire(&self, zone: Zone, lo: DateTime<Utc>, hi: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let tz = zone.tz();
        let offset = |t: DateTime<Utc>| tz.offset_from_utc_datetime(&t.naive_utc()).fix().local_minus_utc();
        // Chunks of 30 days: at most one transition in each.
        let mut a = lo;
        while a < hi {
            let b = (a + chrono::Duration::days(30)).min(hi);
            let (before, after) = (offset(a), offset(b));
            if after > before {
                // The first second on the new offset.
                let (mut l, mut h) = (a, b);
                while h - l > chrono::Duration::seconds(1) {
                    let m = l + (h - l) / 2;
                    if offset(m) == after { h = m } else { l = m }
                }
                let wall_from = h.naive_utc() + chrono::Duration::seconds(i64::from(before));
                let wall_to = h.naive_utc() + chrono::Duration::seconds(i64::from(after));
                let named = self.cron.find_next_occurrence(&(wall_from - chrono::Duration::seconds(1)), false).ok();
                if named.is_some_and(|n| n < wall_to) && h > lo && h <= hi {
                    return Some(whole_second(h));
                }
            }
            a = b;
        }
        None
    }

    /// The last fire strictly before `before`, in `zone` (second passes dropped, as forward).
    pub fn previous_before(&self, zone: Zone, before: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let tz = zone.tz();
        // Before 10:00:00.2 is 10:00:00 or before it.
        let mut inclusive = whole_second(before) != before;
        let mut from = whole_second(before).with_timezone(&tz);
        for _ in 0..10_000 {
            let t = self.cron.find_previous_occurrence(&from, inclusive).ok()?.with_timezone(&Utc);
            // As forward: a skipped time's fire between the two.
            let upto = if inclusive { from.with_timezone(&Utc) } else { from.with_timezone(&Utc) - chrono::Duration::seconds(1) };
            inclusive = false;
            if let Some(gap) = self.gap_fire(zone, t, upto).filter(|g| *g > t) {
                return Some(gap);
            }
            if !second_pass(zone, t) {
                return Some(t);
            }
            from = t.with_timezone(&tz);
        }
        None
    }

    /// The first fire at `at` or after it.
    pub fn first_from(&self, zone: Zone, at: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.next_after(zone, at - chrono::Duration::milliseconds(1))
    }
}

fn whole_second(t: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp(t.timestamp(), 0).unwrap_or(t)
}

/// Whether `t` is the later instant of a wall-clock time that a fall-back day repeats.
fn second_pass(zone: Zone, t: DateTime<Utc>) -> bool {
    let tz = zone.tz();
    let wall = t.with_timezone(&tz).naive_local();
    matches!(tz.from_local_datetime(&wall), LocalResult::Ambiguous(first, _) if first.with_timezone(&Utc) != t)
}

/// The 1-based column where each whitespace-separated field of `text` starts.
fn field_columns(text: &str) -> Vec<usize> {
    let mut out = Vec::new();
    let mut in_field = false;
    for (i, c) in text.chars().enumerate() {
        if c.is_whitespace() {
            in_field = false;
        } else if !in_field {
            in_field = true;
            out.push(i + 1);
        }
    }
    out
}

/// croner's error, located: the first field that is refused on its own (the others `*`) is the
/// one at fault.
fn locate(text: &str, columns: &[usize], e: &croner::errors::CronError) -> CronError {
    let fields: Vec<&str> = text.split_whitespace().collect();
    let named = if fields.len() == 6 { ["second"].iter().chain(FIELDS.iter()).copied().collect::<Vec<_>>() } else { FIELDS.to_vec() };
    for (i, field) in fields.iter().enumerate() {
        let alone: Vec<&str> = (0..fields.len()).map(|j| if j == i { *field } else { "*" }).collect();
        if let Err(alone) = parser().parse(&alone.join(" ")) {
            return CronError::Field {
                field: i + 1,
                name: named.get(i).copied().unwrap_or("field"),
                column: columns.get(i).copied().unwrap_or(0),
                message: alone.to_string(),
            };
        }
    }
    CronError::Whole { message: e.to_string() }
}
