//! A model profile's fallbacks: `fallbacks: [profile, ...]`, `fallback_on_invalid`,
//! `prefer_available`. Decoded with the profile; checked once every profile is: a fallback that
//! names no profile, a cycle (a profile reached again through its fallbacks' own fallbacks) and
//! a fallback that is broken itself break the profile, located at the entry.

use crate::defs::{ProfileFallbacks, Ref, fallback_chain};
use crate::diag::Diagnostics;
use crate::yaml::{Ctx, Fields};

use super::Defs;
use super::decode::reference;

/// The fallback keys of a profile's fields.
pub(super) fn decode(ctx: &mut Ctx<'_>, f: &mut Fields<'_>) -> ProfileFallbacks {
    let names = match f.get("fallbacks") {
        Some(n) => ctx.seq(n, "`fallbacks`").map(|items| items.iter().filter_map(|i| reference(ctx, i, "a model profile name")).collect()).unwrap_or_default(),
        None => Vec::new(),
    };
    let flag = |ctx: &mut Ctx<'_>, f: &mut Fields<'_>, key: &'static str| f.get(key).and_then(|n| ctx.bool(n, &format!("`{key}`"))).unwrap_or(false);
    let on_invalid = flag(ctx, f, "fallback_on_invalid");
    let prefer_available = flag(ctx, f, "prefer_available");
    ProfileFallbacks { names, on_invalid, prefer_available }
}

/// Whether a way leads from `name` back to `start` through fallbacks.
fn cycle_entry(defs: &Defs, start: &str, name: &str, seen: &mut Vec<String>) -> bool {
    if seen.iter().any(|s| s == name) {
        return false;
    }
    seen.push(name.to_owned());
    let Some(Ok(p)) = defs.profiles.get(name) else { return false };
    p.fallbacks.names.iter().any(|f| f.name == start || cycle_entry(defs, start, &f.name, seen))
}

pub(super) fn check(defs: &mut Defs, diags: &mut Diagnostics) {
    let ids: Vec<String> = defs.profiles.keys().cloned().collect();
    // First each profile's own entries, then what each inherits from its whole chain (a
    // fallback's fallback broken breaks the chain too).
    for id in &ids {
        let Some(Ok(p)) = defs.profiles.get(id) else { continue };
        if p.fallbacks.names.is_empty() {
            continue;
        }
        let path = p.origin.path.clone();
        let mut ctx = Ctx { path: &path, diags };
        let mark = ctx.diags.len();
        let mut named: Vec<&Ref> = Vec::new();
        for f in &p.fallbacks.names {
            if named.iter().any(|n| n.name == f.name) || f.name == *id {
                let what = if f.name == *id { "the profile itself" } else { "named twice" };
                ctx.error(f.pos, format!("fallback `{}` of model profile `{id}` is {what}", f.name));
                continue;
            }
            named.push(f);
            match defs.profiles.get(&f.name) {
                None => ctx.error(
                    f.pos,
                    format!("fallback `{}` of model profile `{id}` is not a model profile (profiles: {})", f.name, super::known_names(defs.profiles.keys())),
                ),
                Some(_) if cycle_entry(defs, id, &f.name, &mut Vec::new()) => {
                    ctx.error(f.pos, format!("fallback `{}` of model profile `{id}` leads back to `{id}`: fallbacks must not form a cycle", f.name));
                }
                Some(_) => {}
            }
        }
        let problems = ctx.diags.since(mark).to_vec();
        if let Some(Ok(p)) = defs.profiles.get_mut(id) {
            p.origin.problems.extend(problems);
        }
    }
    for id in &ids {
        let Some(Ok(p)) = defs.profiles.get(id) else { continue };
        if p.fallbacks.names.is_empty() {
            continue;
        }
        let members = fallback_chain(id, |n| defs.profiles.get(n).and_then(|e| e.as_ref().ok()));
        let mut inherited = Vec::new();
        for m in members.iter().skip(1) {
            let problems = match defs.profiles.get(*m) {
                Some(Ok(q)) => &q.origin.problems,
                Some(Err(o)) => &o.problems,
                None => continue,
            };
            for d in problems.iter().filter(|d| d.is_error()) {
                if !p.origin.problems.contains(d) && !inherited.contains(d) {
                    inherited.push(d.clone());
                }
            }
        }
        if let Some(Ok(p)) = defs.profiles.get_mut(id) {
            p.origin.problems.extend(inherited);
        }
    }
}
