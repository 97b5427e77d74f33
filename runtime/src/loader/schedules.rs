//! A route's declared schedules (`schedules:` of a route): each a name and the fields of a
//! schedule's definition (docs/operations.md, "Scheduled runs"), checked at load as a schedule
//! sent to `POST /v1/schedules` is (the expression, the zone, the overlap and catch-up policies),
//! located; the service keeps them in the run store as `{route}/{name}`.

use serde_json::{Map, Value};

use crate::defs::DeclaredSchedule;
use crate::schedule::{Catchup, CronSpec, Overlap, Zone};
use crate::yaml::{self, Ctx, Node};

/// The `schedules:` mapping of route `route`.
pub(super) fn decode(ctx: &mut Ctx<'_>, node: &Node, route: &str) -> Vec<DeclaredSchedule> {
    let mut out = Vec::new();
    for (key, body) in yaml::entries(ctx, node, &format!("a schedule of route `{route}`")) {
        if let Some(fields) = schedule(ctx, body, route, &key.name) {
            out.push(DeclaredSchedule { name: key.name.clone(), pos: key.pos, fields });
        }
    }
    out
}

/// One schedule's fields as JSON, every one checked.
fn schedule(ctx: &mut Ctx<'_>, node: &Node, route: &str, name: &str) -> Option<Map<String, Value>> {
    let what = format!("schedule `{name}` of route `{route}`");
    let mut f = ctx.map(node, &what)?;
    let mut out = Map::new();
    let mut ok = true;
    let cron = f.require(ctx, "cron").and_then(|n| ctx.string(n, "`cron`").map(|c| (c, n.pos)));
    match &cron {
        Some((c, pos)) => {
            if let Err(e) = CronSpec::parse(c) {
                ctx.error(*pos, format!("`cron` of {what}: {e}"));
                ok = false;
            }
            out.insert("cron".into(), Value::String(c.clone()));
        }
        None => ok = false,
    }
    match f.get("goal") {
        Some(g) => match yaml::to_json(g) {
            Value::Object(goal) => drop(out.insert("goal".into(), Value::Object(goal))),
            _ => {
                ctx.error(g.pos, format!("`goal` of {what} must be a mapping (the run's goal)"));
                ok = false;
            }
        },
        None => drop(out.insert("goal".into(), Value::Object(Map::new()))),
    }
    let mut text = |ctx: &mut Ctx<'_>, key: &'static str, check: &dyn Fn(&str) -> Option<String>| {
        let n = f.get(key)?;
        let s = ctx.string(n, &format!("`{key}`"))?;
        if let Some(why) = check(&s) {
            ctx.error(n.pos, format!("`{key}` of {what}: {why}"));
            return Some(false);
        }
        out.insert(key.into(), Value::String(s));
        Some(true)
    };
    // Each check says what is wrong, if anything.
    let none = |_: &str| None;
    ok &= text(ctx, "timezone", &|z| Zone::parse(z).err().map(|e| e.to_string())).unwrap_or(true);
    ok &= text(ctx, "overlap", &|o| Overlap::parse(o).is_none().then(|| "not one of skip, buffer_one, allow_all, cancel_other".to_owned())).unwrap_or(true);
    ok &= text(ctx, "catchup", &|c| Catchup::parse(c, None, None).err().map(|e| e.to_string())).unwrap_or(true);
    ok &= text(ctx, "catchup_window", &|w| humantime::parse_duration(w).err().map(|e| e.to_string())).unwrap_or(true);
    for key in ["model_profile", "session_id", "webhook_url"] {
        ok &= text(ctx, key, &none).unwrap_or(true);
    }
    if let Some(n) = f.get("max_catchup_runs") {
        match ctx.uint(n, "`max_catchup_runs`", 1, 100) {
            Some(m) => drop(out.insert("max_catchup_runs".into(), Value::from(m))),
            None => ok = false,
        }
    }
    if let Some(n) = f.get("paused") {
        match ctx.bool(n, "`paused`") {
            Some(p) => drop(out.insert("paused".into(), Value::Bool(p))),
            None => ok = false,
        }
    }
    f.get("description");
    f.finish(ctx);
    ok.then_some(out)
}
