//! What a start does when its session already has a live run (`FABRIC_SESSION_POLICY`, or a
//! start contract's `multitask`).

use crate::vocab::{ConfigError, err};

/// A session's policy for a new run while another run of the session is live (running,
/// queued or awaiting input).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SessionPolicy {
    /// Both run (the behaviour without a policy).
    #[default]
    Allow,
    /// The new run is refused (`409 session_busy`, naming the live run).
    Reject,
    /// The new run waits, queued, until every older live run of the session ended.
    Enqueue,
    /// The live runs are cancelled (reason `interrupted_by_session`); the new run starts once
    /// they ended.
    Interrupt,
}

/// The cancel reason of a run interrupted by a newer run of its session.
pub const INTERRUPTED_BY_SESSION: &str = "interrupted_by_session";

impl SessionPolicy {
    pub const ALL: [SessionPolicy; 4] = [SessionPolicy::Allow, SessionPolicy::Reject, SessionPolicy::Enqueue, SessionPolicy::Interrupt];

    pub fn as_str(self) -> &'static str {
        match self {
            SessionPolicy::Allow => "allow",
            SessionPolicy::Reject => "reject",
            SessionPolicy::Enqueue => "enqueue",
            SessionPolicy::Interrupt => "interrupt",
        }
    }

    /// `FABRIC_SESSION_POLICY` (unset: `allow`).
    pub(super) fn load(value: Option<&str>) -> Result<SessionPolicy, ConfigError> {
        let Some(v) = value.map(str::trim).filter(|v| !v.is_empty()) else { return Ok(SessionPolicy::Allow) };
        SessionPolicy::ALL
            .into_iter()
            .find(|p| p.as_str().eq_ignore_ascii_case(v))
            .ok_or_else(|| err("FABRIC_SESSION_POLICY", format!("`{v}` is not a session policy; use allow, reject, enqueue or interrupt")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_read_by_name_and_default_to_allow() {
        assert_eq!(SessionPolicy::load(None), Ok(SessionPolicy::Allow));
        assert_eq!(SessionPolicy::load(Some(" Enqueue ")), Ok(SessionPolicy::Enqueue));
        assert_eq!(SessionPolicy::load(Some("queue")).unwrap_err().var, "FABRIC_SESSION_POLICY");
        let p: SessionPolicy = serde_json::from_str("\"interrupt\"").unwrap();
        assert_eq!(p, SessionPolicy::Interrupt);
        assert!(serde_json::from_str::<SessionPolicy>("\"Reject\"").is_err(), "the contract's value is exact");
    }
}
