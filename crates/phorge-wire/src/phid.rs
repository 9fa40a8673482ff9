//! PHID parsing, as Phorge's `phid_get_type()` does it.
//!
//! The webhook payload's `object.type` is the PHID's type; Phorge matches
//! `/^PHID-([^-]{4})-/` on bytes and falls back to `????` (`PHID_TYPE_UNKNOWN`).

/// Phorge's `PhabricatorPHIDConstants::PHID_TYPE_UNKNOWN`.
pub const UNKNOWN_TYPE: &str = "????";

/// The four characters after `PHID-` when they contain no `-` and are followed by `-`:
/// `phid_type("PHID-TASK-abc") == Some("TASK")`.
///
/// Phorge matches bytes; a four-byte type that is not valid UTF-8 on its own (a multi-byte
/// character cut in half) would make PHP's `json_encode` fail, so it is treated as malformed.
pub fn phid_type(phid: &str) -> Option<&str> {
    let bytes = phid.as_bytes();
    if bytes.len() < 10 || !bytes.starts_with(b"PHID-") || bytes[9] != b'-' {
        return None;
    }
    let kind = phid.get(5..9)?;
    (!kind.contains('-')).then_some(kind)
}

/// [`phid_type`] or [`UNKNOWN_TYPE`].
pub fn object_type_or_unknown(phid: &str) -> &str {
    phid_type(phid).unwrap_or(UNKNOWN_TYPE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn well_formed_phids() {
        assert_eq!(phid_type("PHID-TASK-abc"), Some("TASK"));
        assert_eq!(phid_type("PHID-XACT-TASK-abc"), Some("XACT"));
        assert_eq!(phid_type("PHID-HWBH-"), Some("HWBH"));
        assert_eq!(phid_type("PHID-????-x"), Some("????"));
    }

    #[test]
    fn malformed_phids_are_unknown() {
        for phid in [
            "",
            "not-a-phid",
            "PHID-TASK",
            "PHID-TAS-abc",
            "PHID-TASKS-abc",
            "PHID-TA-K-abc",
            "phid-TASK-abc",
            "XPHID-TASK-abc",
            "PHID-é中-x",
        ] {
            assert_eq!(phid_type(phid), None, "{phid:?}");
            assert_eq!(object_type_or_unknown(phid), "????", "{phid:?}");
        }
    }

    #[test]
    fn multibyte_type_that_fits_four_bytes() {
        assert_eq!(phid_type("PHID-éé-x"), Some("éé"));
    }
}
