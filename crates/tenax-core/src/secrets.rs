//! Secret payload fields: which fields of a command type's payload are secret, and the
//! one masking function every way out of Tenax applies.
//!
//! A deployment names, per command type, the payload fields that are secret
//! ([`Secrets::new`]). For one task, [`Secrets::masker`] finds those fields in its
//! payload and returns a [`Masker`], which
//!
//! - replaces each secret field's value by `"***"` in the payload and, under the same
//!   paths, in the result (a handler may echo its input);
//! - replaces every literal copy of a secret value in any other text of the task: an
//!   error that quotes it, a result that embeds it, a program's echoed output.
//!
//! # Paths
//!
//! A path is a list of keys joined by dots: `card.number`. A key followed by `[]`
//! names each element of an array: `cards[].number`. Arrays met on the way are entered
//! even without `[]`, so `cards.number` masks the `number` of every card as well. A key
//! that itself contains dots matches too: `card.number` masks a top-level key literally
//! named `"card.number"`. When a path runs into a string or a number before its end
//! (`"card": "4111 … 12/29"` for `card.number`, or an array element that is not an
//! object), that whole value is masked, and each of its words counts as a secret
//! value: the secret may be written anywhere in it. A secret whose value is an object
//! or an array is masked whole, and every string and number inside it counts as a
//! secret value.
use std::borrow::Cow;
use std::collections::BTreeMap;

use serde_json::Value;

use crate::InvalidInput;

/// What a masked value is replaced by.
pub const MASK: &str = "***";

/// Shortest secret value (in characters) replaced where it appears literally in a
/// task's texts. A shorter one (a one-digit flag) would garble every text it is masked
/// in; its field is still masked.
pub const LITERAL_MIN_CHARS: usize = 3;

/// Shortest word of a masked text (see [`Masker`]) that counts as a secret value on
/// its own.
pub const WORD_MIN_CHARS: usize = 4;

/// The secret payload fields of each command type. The default has none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Secrets {
    by_type: BTreeMap<String, Vec<SecretPath>>,
}

/// One secret field's path, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretPath {
    text: String,
    keys: Vec<Key>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Key {
    name: String,
    /// Written `name[]`: each element of the array under `name`.
    each: bool,
}

impl SecretPath {
    /// Parse a path such as `card.number` or `cards[].number`.
    pub fn parse(text: &str) -> Result<Self, InvalidInput> {
        let refuse = |why: &str| {
            InvalidInput::new(
                "secrets",
                format!("{text:?}: {why} (paths look like card.number or cards[].number)"),
            )
        };
        if text.is_empty() {
            return Err(refuse("a path must not be empty"));
        }
        let mut keys = Vec::new();
        for part in text.split('.') {
            let (name, each) = match part.strip_suffix("[]") {
                Some(name) => (name, true),
                None => (part, false),
            };
            if name.is_empty() {
                return Err(refuse("every key must be named"));
            }
            if name.contains('[') || name.contains(']') {
                return Err(refuse("[] may only end a key"));
            }
            keys.push(Key {
                name: name.to_owned(),
                each,
            });
        }
        Ok(Self {
            text: text.to_owned(),
            keys,
        })
    }

    /// The path as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl Secrets {
    /// The secret fields of each command type (`{"billing": ["card.number"]}`).
    pub fn new<I, F, S>(by_type: I) -> Result<Self, InvalidInput>
    where
        I: IntoIterator<Item = (S, F)>,
        F: IntoIterator,
        F::Item: AsRef<str>,
        S: Into<String>,
    {
        let mut secrets = Self::default();
        for (command_type, fields) in by_type {
            let command_type = command_type.into();
            let paths = fields
                .into_iter()
                .map(|f| SecretPath::parse(f.as_ref()))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| {
                    InvalidInput::new("secrets", format!("{command_type}: {}", e.reason))
                })?;
            secrets
                .by_type
                .entry(command_type)
                .or_default()
                .extend(paths);
        }
        Ok(secrets)
    }

    /// Whether no command type has a secret field.
    pub fn is_empty(&self) -> bool {
        self.by_type.values().all(Vec::is_empty)
    }

    /// Whether this command type has secret fields.
    pub fn covers(&self, command_type: &str) -> bool {
        self.by_type
            .get(command_type)
            .is_some_and(|p| !p.is_empty())
    }

    /// The secret paths of each command type, as written.
    pub fn fields(&self) -> impl Iterator<Item = (&str, Vec<&str>)> {
        self.by_type
            .iter()
            .map(|(t, paths)| (t.as_str(), paths.iter().map(SecretPath::as_str).collect()))
    }

    /// The masker of one task, from its command type and its payload as stored (JSON
    /// text). A payload that is not JSON has no fields: its masker masks nothing.
    pub fn masker(&self, command_type: &str, payload: &str) -> Masker<'_> {
        match self.by_type.get(command_type) {
            Some(paths) if !paths.is_empty() => match serde_json::from_str(payload) {
                Ok(mut value) => Masker::of(paths, &mut value),
                Err(_) => Masker::NONE,
            },
            _ => Masker::NONE,
        }
    }

    /// Mask a payload in place (its secret fields and any literal copy of their values
    /// elsewhere in it), and return the masker for the rest of the task's texts.
    pub fn mask_payload(&self, command_type: &str, payload: &mut Value) -> Masker<'_> {
        match self.by_type.get(command_type) {
            Some(paths) if !paths.is_empty() => {
                let masker = Masker::of(paths, payload);
                masker.replace_literals(payload);
                masker
            }
            _ => Masker::NONE,
        }
    }
}

/// Masks the texts of one task: see the [module documentation](self).
#[derive(Debug, Clone)]
pub struct Masker<'a> {
    paths: &'a [SecretPath],
    /// The secret values found in the payload, longest first.
    literals: Vec<String>,
}

impl<'a> Masker<'a> {
    /// The masker of a task whose type has no secret fields.
    pub const NONE: Masker<'static> = Masker {
        paths: &[],
        literals: Vec::new(),
    };

    /// Mask `payload` under `paths`, keeping the values found.
    fn of(paths: &'a [SecretPath], payload: &mut Value) -> Self {
        let mut found = Vec::new();
        for path in paths {
            visit(payload, &path.keys, &mut found);
        }
        found.retain(|v| v.chars().count() >= LITERAL_MIN_CHARS && v != MASK);
        found.sort_by_key(|v| std::cmp::Reverse(v.len()));
        found.dedup();
        Self {
            paths,
            literals: found,
        }
    }

    /// Whether this masker leaves everything as it is.
    pub fn is_none(&self) -> bool {
        self.paths.is_empty()
    }

    /// Mask a JSON value of the task (its result): the secret paths, then every
    /// literal secret value in its strings.
    pub fn json(&self, value: &mut Value) {
        if self.is_none() {
            return;
        }
        let mut found = Vec::new();
        for path in self.paths {
            visit(value, &path.keys, &mut found);
        }
        self.replace_literals(value);
    }

    /// Mask a JSON text of the task (a stored result). Text that is not JSON is masked
    /// as [`text`](Self::text).
    pub fn json_text<'t>(&self, text: &'t str) -> Cow<'t, str> {
        if self.is_none() {
            return Cow::Borrowed(text);
        }
        match serde_json::from_str::<Value>(text) {
            Ok(mut value) => {
                let before = value.clone();
                self.json(&mut value);
                if value == before {
                    Cow::Borrowed(text)
                } else {
                    Cow::Owned(value.to_string())
                }
            }
            Err(_) => self.text(text),
        }
    }

    /// Replace every literal secret value in a text of the task (an error).
    pub fn text<'t>(&self, text: &'t str) -> Cow<'t, str> {
        let mut out = Cow::Borrowed(text);
        for literal in &self.literals {
            if out.contains(literal.as_str()) {
                out = Cow::Owned(out.replace(literal.as_str(), MASK));
            }
        }
        out
    }

    fn replace_literals(&self, value: &mut Value) {
        if self.literals.is_empty() {
            return;
        }
        match value {
            Value::String(s) => {
                if let Cow::Owned(masked) = self.text(s) {
                    *s = masked;
                }
            }
            Value::Number(n) => {
                let text = n.to_string();
                if self.literals.iter().any(|l| text.contains(l.as_str())) {
                    *value = Value::String(MASK.to_owned());
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|v| self.replace_literals(v)),
            Value::Object(map) => map.values_mut().for_each(|v| self.replace_literals(v)),
            Value::Null | Value::Bool(_) => {}
        }
    }
}

/// Mask what `keys` names under `value`, collecting the masked values.
fn visit(value: &mut Value, keys: &[Key], found: &mut Vec<String>) {
    match value {
        // An element where the path expects an object is masked, as a parent given as
        // a string is (see `descend`).
        Value::Array(items) => items
            .iter_mut()
            .for_each(|v| descend(v, false, keys, found)),
        Value::Object(map) => {
            // The next key, or the next keys joined by dots when a key holds dots.
            let mut joined = String::new();
            for (n, key) in keys.iter().enumerate() {
                if n > 0 {
                    joined.push('.');
                }
                joined.push_str(&key.name);
                if let Some(child) = map.get_mut(&joined) {
                    descend(child, key.each, &keys[n + 1..], found);
                }
                if key.each {
                    break; // `a[].b` never names a key "a[].b"
                }
            }
        }
        Value::String(_) | Value::Number(_) | Value::Bool(_) | Value::Null => {}
    }
}

fn descend(child: &mut Value, each: bool, rest: &[Key], found: &mut Vec<String>) {
    match child {
        Value::Array(items) if each => {
            for item in items {
                if rest.is_empty() {
                    mask(item, found);
                } else {
                    descend(item, false, rest, found);
                }
            }
        }
        Value::Null => {}
        _ if rest.is_empty() => mask(child, found),
        Value::Object(_) | Value::Array(_) => visit(child, rest, found),
        // The path runs into a scalar before its end: the secret may be anywhere in
        // it, so each of its words counts as a secret value too.
        Value::String(text) => {
            found.extend(
                words(text)
                    .filter(|w| w.chars().count() >= WORD_MIN_CHARS)
                    .map(str::to_owned),
            );
            mask(child, found);
        }
        Value::Number(_) | Value::Bool(_) => mask(child, found),
    }
}

/// The words of a text that holds a secret somewhere: split at white space and at the
/// punctuation that separates fields (`,;:="'&` and brackets), not inside a number
/// written with `-`, `/` or `.`.
fn words(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| c.is_whitespace() || ",;:=\"'&{}[]()<>".contains(c))
        .filter(|w| !w.is_empty())
}

/// Replace a secret value by the mask, keeping every string and number in it.
fn mask(value: &mut Value, found: &mut Vec<String>) {
    fn collect(value: &Value, found: &mut Vec<String>) {
        match value {
            Value::String(s) => found.push(s.clone()),
            Value::Number(n) => found.push(n.to_string()),
            Value::Array(items) => items.iter().for_each(|v| collect(v, found)),
            Value::Object(map) => map.values().for_each(|v| collect(v, found)),
            Value::Null | Value::Bool(_) => {}
        }
    }
    if value.is_null() {
        return;
    }
    collect(value, found);
    *value = Value::String(MASK.to_owned());
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn secrets(paths: &[&str]) -> Secrets {
        Secrets::new([("pay", paths.to_vec())]).expect("valid paths")
    }

    fn masked(paths: &[&str], payload: Value) -> Value {
        let mut payload = payload;
        let _ = secrets(paths).mask_payload("pay", &mut payload);
        payload
    }

    #[test]
    fn a_nested_field_is_masked_and_its_siblings_kept() {
        let got = masked(
            &["card.number"],
            json!({"card": {"number": "4111111111111111", "brand": "visa"}, "amount": 5}),
        );
        assert_eq!(
            got,
            json!({"card": {"number": "***", "brand": "visa"}, "amount": 5})
        );
    }

    #[test]
    fn every_element_of_an_array_is_masked_with_or_without_brackets() {
        // An element that is not an object may hold the secret: it is masked too.
        let payload = json!({"cards": [{"number": "4111111111111111"}, {"number": "5500000000000004"}, "x", null]});
        let want = json!({"cards": [{"number": "***"}, {"number": "***"}, "***", null]});
        assert_eq!(masked(&["cards[].number"], payload.clone()), want);
        assert_eq!(masked(&["cards.number"], payload), want);
        assert_eq!(
            masked(&["pins[]"], json!({"pins": ["1234", "9876"]})),
            json!({"pins": ["***", "***"]})
        );
    }

    #[test]
    fn a_key_holding_dots_is_masked() {
        let got = masked(
            &["card.number"],
            json!({"card.number": "4111111111111111", "cardnumber": "kept"}),
        );
        assert_eq!(got, json!({"card.number": "***", "cardnumber": "kept"}));
    }

    #[test]
    fn a_parent_given_as_a_string_is_masked_whole_and_each_word_is_a_literal() {
        let got = masked(&["card.number"], json!({"card": "4111111111111111 12/29"}));
        assert_eq!(got, json!({"card": "***"}));
        let s = secrets(&["card.number"]);
        let masker = s.masker(
            "pay",
            r#"{"card": "number=4111111111111111, expires 12/29"}"#,
        );
        assert_eq!(
            masker.text("no such card 4111111111111111 (expired 12/29)"),
            "no such card *** (expired ***)"
        );
    }

    #[test]
    fn a_secret_whose_value_is_an_object_is_masked_whole_and_its_values_are_literals() {
        let s = secrets(&["card"]);
        let mut payload = json!({"card": {"number": "4111111111111111", "cvv": 123}});
        let masker = s.mask_payload("pay", &mut payload);
        assert_eq!(payload, json!({"card": "***"}));
        assert_eq!(
            masker.text("declined 4111111111111111 (cvv 123)"),
            "declined *** (cvv ***)"
        );
    }

    #[test]
    fn literal_copies_are_replaced_in_errors_and_results() {
        let s = secrets(&["id_card"]);
        let masker = s.masker("pay", r#"{"id_card": "X123456", "name": "Ada"}"#);
        assert_eq!(
            masker.text("invalid id card X123456"),
            "invalid id card ***"
        );
        assert_eq!(
            masker.json_text(r#"{"echo": "card X123456", "id_card": "other", "n": 1}"#),
            r#"{"echo":"card ***","id_card":"***","n":1}"#
        );
        assert_eq!(masker.json_text("stdout: X123456\n"), "stdout: ***\n");
        assert!(matches!(masker.text("nothing here"), Cow::Borrowed(_)));
    }

    #[test]
    fn short_values_are_masked_in_place_but_not_replaced_in_texts() {
        let s = secrets(&["flag"]);
        let masker = s.masker("pay", r#"{"flag": "1"}"#);
        assert_eq!(masker.text("attempt 1 of 5"), "attempt 1 of 5");
        assert_eq!(masker.json_text(r#"{"flag": "1"}"#), r#"{"flag":"***"}"#);
    }

    #[test]
    fn other_types_and_missing_fields_are_untouched() {
        let s = secrets(&["card.number"]);
        let masker = s.masker("other", r#"{"card": {"number": "4111111111111111"}}"#);
        assert!(masker.is_none());
        assert_eq!(masker.text("4111111111111111"), "4111111111111111");
        assert_eq!(masked(&["card.number"], json!({"x": 1})), json!({"x": 1}));
        assert_eq!(
            masked(&["card.number"], json!({"card": null})),
            json!({"card": null})
        );
        assert!(s.masker("pay", "not json").is_none());
    }

    #[test]
    fn bad_paths_are_refused_with_the_type_and_path() {
        for bad in [
            "",
            "card.",
            ".number",
            "card..number",
            "ca[]rd",
            "[]",
            "card[0]",
        ] {
            let err = Secrets::new([("pay", vec![bad])]).expect_err(bad);
            assert!(err.reason.starts_with("pay: "), "{err}");
        }
    }
}
