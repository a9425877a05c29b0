//! `?schema=NAME` in a PostgreSQL URL: Tenax's tables in a schema of their own.
use tenax_core::InvalidInput;

use crate::error::Result;

/// Split `schema=NAME` off a URL's query string.
pub(super) fn take_schema(url: &str) -> Result<(String, Option<String>)> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), None));
    };
    let mut schema = None;
    let mut rest = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.strip_prefix("schema=") {
            Some(name) => schema = Some(name.to_owned()),
            None => rest.push(pair),
        }
    }
    if let Some(name) = &schema {
        let valid = !name.is_empty()
            && name.len() <= 63
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            && !name.starts_with(|c: char| c.is_ascii_digit());
        if !valid {
            return Err(InvalidInput::new(
                "schema",
                format!("{name:?}: use 1 to 63 of a-z, 0-9 and _, not starting with a digit"),
            )
            .into());
        }
    }
    let url = if rest.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", rest.join("&"))
    };
    Ok((url, schema))
}
