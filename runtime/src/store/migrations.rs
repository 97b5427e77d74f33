//! What both stores do with their numbered migrations besides running them: each applied
//! migration's checksum (SHA-256 of its SQL) is recorded in `fabric_schema`, and a database
//! whose recorded checksum differs from this binary's migration of the same number is refused:
//! someone edited a migration after it was applied, and the schema is not what the code
//! expects. A version applied by a runtime before checksums were recorded gets its checksum
//! filled in on first sight.

use sha2::{Digest, Sha256};

use super::StoreError;

/// The hex SHA-256 of a migration's SQL.
pub(crate) fn checksum(sql: &str) -> String {
    Sha256::digest(sql.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// The applied versions (with their recorded checksums, if any) against the known migrations:
/// the versions whose checksum is to be filled in, or the first edited migration.
pub(crate) fn verify(applied: &[(i64, Option<String>)], known: &[(i64, &str)]) -> Result<Vec<(i64, String)>, StoreError> {
    let mut fill = Vec::new();
    for (version, recorded) in applied {
        let Some((_, sql)) = known.iter().find(|(v, _)| v == version) else { continue };
        let sum = checksum(sql);
        match recorded {
            None => fill.push((*version, sum)),
            Some(r) if *r == sum => {}
            Some(r) => {
                return Err(StoreError::Database(format!(
                    "migration {version} was changed after it was applied to this database (its checksum here is {sum}, the database recorded {r}): \
                     a migration already applied must never be edited; add a new one instead"
                )));
            }
        }
    }
    Ok(fill)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_edited_migration_is_refused_and_an_unrecorded_one_is_filled_in() {
        let known = [(1, "CREATE TABLE a (x INTEGER);"), (2, "CREATE TABLE b (y INTEGER);")];
        let good = (1, Some(checksum(known[0].1)));
        assert_eq!(verify(&[good.clone(), (2, None)], &known).unwrap(), vec![(2, checksum(known[1].1))]);
        let edited = (2, Some(checksum("CREATE TABLE b (y TEXT);")));
        let e = verify(&[good, edited], &known).unwrap_err();
        assert!(e.to_string().contains("migration 2 was changed"), "{e}");
        assert_eq!(checksum("").len(), 64);
    }
}
