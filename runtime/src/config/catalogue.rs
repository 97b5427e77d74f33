//! How a fleet treats catalogue versions: which version a run taken up again goes on on
//! (`FABRIC_RESUME_ON`), and whether a change on disk reloads the catalogue
//! (`FABRIC_CATALOGUE_WATCH`).

use std::time::Duration;

use crate::vocab::{ConfigError, err};

/// Which catalogue version a run goes on on when it is taken up again (after a crash, by another
/// replica, after a reply).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ResumeOn {
    /// The version it started on, rebuilt from the store when it is not the one loaded.
    #[default]
    Recorded,
    /// The version loaded here; the run's events say that it moved.
    Current,
}

impl ResumeOn {
    pub fn as_str(self) -> &'static str {
        match self {
            ResumeOn::Recorded => "recorded",
            ResumeOn::Current => "current",
        }
    }

    /// `FABRIC_RESUME_ON` (unset: `recorded`).
    pub(super) fn load(value: Option<&str>) -> Result<ResumeOn, ConfigError> {
        match value.map(str::trim).filter(|v| !v.is_empty()) {
            None => Ok(ResumeOn::Recorded),
            Some(v) if v.eq_ignore_ascii_case("recorded") => Ok(ResumeOn::Recorded),
            Some(v) if v.eq_ignore_ascii_case("current") => Ok(ResumeOn::Current),
            Some(v) => Err(err("FABRIC_RESUME_ON", format!("`{v}` is neither `recorded` nor `current`"))),
        }
    }
}

/// How often `FABRIC_CATALOGUE_WATCH` looks at the files, and how long they must stay the same
/// before they are loaded (an editor's save, a `git checkout` or a ConfigMap swap writes several
/// files one after another).
pub const WATCH_POLL: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resume_on_reads_its_two_values_and_names_its_variable() {
        assert_eq!(ResumeOn::load(None).unwrap(), ResumeOn::Recorded);
        assert_eq!(ResumeOn::load(Some(" Current ")).unwrap(), ResumeOn::Current);
        assert_eq!(ResumeOn::load(Some("recorded")).unwrap(), ResumeOn::Recorded);
        let e = ResumeOn::load(Some("latest")).unwrap_err();
        assert_eq!(e.var, "FABRIC_RESUME_ON");
        assert!(e.message.contains("`latest`"), "{}", e.message);
    }
}
