//! Catalogue versions: what a catalogue was loaded from ([`Sources`]: the route files, the prompt
//! packs and, where the stub answers, its scripts) and its content digest ([`CatalogueVersion`]).
//!
//! A version names content, not a place or a time: two replicas that load the same files from
//! different directories get the same version, and a reload that changes nothing keeps it. The run
//! store keeps each version's sources once, under its digest, so any replica can rebuild the
//! catalogue a run started on; a run records its version and finishes on it.

use sha2::{Digest, Sha256};

use crate::source::NamedText;

/// A catalogue version: the lowercase hex SHA-256 of its [`Sources`] (64 characters).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(transparent)]
pub struct CatalogueVersion(String);

/// How many characters of a version a person sees where space is short (`fabric routes list`).
pub const SHORT_VERSION: usize = 12;

/// Why a text is no [`CatalogueVersion`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{}` is not a catalogue version (64 lowercase hex digits)", .0.chars().take(80).collect::<String>())]
pub struct BadVersion(pub String);

impl CatalogueVersion {
    /// A version as written (`GET /v1/runs/{id}`, the store's rows): exactly 64 lowercase hex digits.
    pub fn parse(text: &str) -> Result<CatalogueVersion, BadVersion> {
        if text.len() == 64 && text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            Ok(CatalogueVersion(text.to_owned()))
        } else {
            Err(BadVersion(text.to_owned()))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Its first [`SHORT_VERSION`] digits.
    pub fn short(&self) -> &str {
        &self.0[..SHORT_VERSION]
    }
}

impl std::fmt::Display for CatalogueVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for CatalogueVersion {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        CatalogueVersion::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// What a catalogue version is made of, each part's files in the order they were read (the order
/// loading takes them in).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Sources {
    pub routes: Vec<NamedText>,
    pub packs: Vec<NamedText>,
    /// The stub's scripts, when the stub answers the model calls (its replies are part of what a
    /// run does); `None` with a provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stub: Option<Vec<NamedText>>,
}

impl Sources {
    /// The content digest. Every part and file is framed by its length, so no two different
    /// sources give one stream of bytes (a file's end cannot pass for the next one's name).
    pub fn version(&self) -> CatalogueVersion {
        let mut h = Sha256::new();
        h.update(b"fabric catalogue 1\n");
        let part = |h: &mut Sha256, tag: &[u8], files: &[NamedText]| {
            h.update(tag);
            h.update((files.len() as u64).to_le_bytes());
            for f in files {
                for text in [&f.name, &f.text] {
                    h.update((text.len() as u64).to_le_bytes());
                    h.update(text.as_bytes());
                }
            }
        };
        part(&mut h, b"routes", &self.routes);
        part(&mut h, b"packs", &self.packs);
        match &self.stub {
            Some(stub) => part(&mut h, b"stub", stub),
            None => h.update(b"provider"),
        }
        use std::fmt::Write;
        CatalogueVersion(h.finalize().iter().fold(String::with_capacity(64), |mut hex, b| {
            let _ = write!(hex, "{b:02x}");
            hex
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, text: &str) -> NamedText {
        NamedText { name: name.into(), text: text.into() }
    }

    #[test]
    fn the_version_names_content_and_nothing_else() {
        let a = Sources { routes: vec![file("r.yaml", "routes: {}\n")], packs: vec![file("p.yaml", "x: y\n")], stub: None };
        assert_eq!(a.version(), a.clone().version(), "the same content, the same version");
        assert_eq!(a.version().as_str().len(), 64);
        let mut b = a.clone();
        b.packs[0].text.push(' ');
        assert_ne!(a.version(), b.version(), "a prompt's change is a new version");
        let mut c = a.clone();
        c.routes[0].name = "s.yaml".into();
        assert_ne!(a.version(), c.version(), "a file renamed is a new version");
        let stubbed = Sources { stub: Some(Vec::new()), ..a.clone() };
        assert_ne!(a.version(), stubbed.version(), "the stub's version is not the provider's");
        // Framing: moving a byte from one file's text to the next file's name changes the version.
        let d = Sources { routes: vec![file("a", "bc"), file("d", "")], ..Sources::default() };
        let e = Sources { routes: vec![file("a", "b"), file("cd", "")], ..Sources::default() };
        assert_ne!(d.version(), e.version());
    }

    #[test]
    fn a_version_reads_back_only_as_one() {
        let v = Sources::default().version();
        assert_eq!(CatalogueVersion::parse(v.as_str()), Ok(v.clone()));
        assert_eq!(serde_json::from_value::<CatalogueVersion>(serde_json::json!(v.as_str())).unwrap(), v);
        for bad in ["", "abc", &v.as_str().to_uppercase(), &format!("{}0", v.as_str()), &"g".repeat(64)] {
            assert!(CatalogueVersion::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(v.short().len(), SHORT_VERSION);
    }
}
