//! Label and field selectors, parsed and matched as apimachinery's
//! `labels.Parse` and `fields.ParseSelector` do.
//!
//! Label selectors: comma-separated requirements, all of which must hold:
//! `key=value`, `key==value`, `key!=value` (also true when the label is
//! missing), `key in (a,b)`, `key notin (a,b)` (also true when missing),
//! `key` (exists), `!key` (does not exist), `key>N`, `key<N` (integer
//! comparison). Field selectors: comma-separated `path=value`,
//! `path==value`, `path!=value`, with `\` escaping `,`, `=`, `!` and `\`.

use serde_json::Value;

use crate::status::ApiError;

/// A parsed label selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct LabelSelector {
    reqs: Vec<LabelReq>,
}

#[derive(Debug, Clone, PartialEq)]
enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
    Gt(String, i64),
    Lt(String, i64),
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<LabelSelector, ApiError> {
        let bad = |why: &str| {
            ApiError::bad_request(format!(
                "unable to parse requirement: invalid label selector {s:?}: {why}"
            ))
        };
        let mut reqs = Vec::new();
        let chars: Vec<char> = s.chars().collect();
        let mut i = 0;
        let skip_ws = |i: &mut usize| {
            while *i < chars.len() && chars[*i].is_whitespace() {
                *i += 1;
            }
        };
        let is_key_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/');
        // The longest run of `wanted` characters from `i` on, and `i` past it.
        let take = |i: &mut usize, wanted: &dyn Fn(char) -> bool| -> String {
            let start = *i;
            while *i < chars.len() && wanted(chars[*i]) {
                *i += 1;
            }
            chars[start..*i].iter().collect()
        };
        loop {
            skip_ws(&mut i);
            if i >= chars.len() {
                if !reqs.is_empty() && s.trim_end().ends_with(',') {
                    return Err(bad("found '', expected: identifier"));
                }
                break;
            }
            let negated = chars[i] == '!';
            if negated {
                i += 1;
                skip_ws(&mut i);
            }
            let key = take(&mut i, &is_key_char);
            if key.is_empty() {
                return Err(bad("expected a label key"));
            }
            validate_label_key(&key).map_err(|e| bad(&e))?;
            skip_ws(&mut i);
            if negated {
                reqs.push(LabelReq::NotExists(key));
            } else if i >= chars.len() || chars[i] == ',' {
                reqs.push(LabelReq::Exists(key));
            } else if chars[i] == '=' || chars[i] == '!' {
                let op_not = chars[i] == '!';
                i += 1;
                if op_not {
                    if chars.get(i) != Some(&'=') {
                        return Err(bad("expected '=' after '!'"));
                    }
                    i += 1;
                } else if chars.get(i) == Some(&'=') {
                    i += 1;
                }
                skip_ws(&mut i);
                let value = take(&mut i, &is_key_char);
                validate_label_value(&value).map_err(|e| bad(&e))?;
                reqs.push(if op_not {
                    LabelReq::NotEq(key, value)
                } else {
                    LabelReq::Eq(key, value)
                });
            } else if chars[i] == '>' || chars[i] == '<' {
                let gt = chars[i] == '>';
                i += 1;
                skip_ws(&mut i);
                let value = take(&mut i, &is_key_char);
                let n: i64 = value
                    .parse()
                    .map_err(|_| bad("for 'Gt', 'Lt' operators, the value must be an integer"))?;
                reqs.push(if gt {
                    LabelReq::Gt(key, n)
                } else {
                    LabelReq::Lt(key, n)
                });
            } else {
                let op = take(&mut i, &|c| c.is_ascii_alphabetic());
                if op != "in" && op != "notin" {
                    return Err(bad(&format!("unknown operator {op:?}")));
                }
                skip_ws(&mut i);
                if chars.get(i) != Some(&'(') {
                    return Err(bad("expected '(' after in/notin"));
                }
                i += 1;
                let inner = take(&mut i, &|c| c != ')');
                if i >= chars.len() {
                    return Err(bad("expected ')'"));
                }
                i += 1;
                let values: Vec<String> = inner.split(',').map(|v| v.trim().to_string()).collect();
                for v in &values {
                    validate_label_value(v).map_err(|e| bad(&e))?;
                }
                reqs.push(if op == "in" {
                    LabelReq::In(key, values)
                } else {
                    LabelReq::NotIn(key, values)
                });
            }
            skip_ws(&mut i);
            if i < chars.len() {
                if chars[i] != ',' {
                    return Err(bad(&format!("unexpected {:?}", chars[i])));
                }
                i += 1;
            }
        }
        Ok(LabelSelector { reqs })
    }

    /// Whether an object (its `metadata.labels`) matches.
    pub fn matches(&self, object: &Value) -> bool {
        if self.reqs.is_empty() {
            return true;
        }
        let labels = object.pointer("/metadata/labels");
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.reqs.iter().all(|r| match r {
            LabelReq::Eq(k, v) => get(k) == Some(v.as_str()),
            LabelReq::NotEq(k, v) => get(k) != Some(v.as_str()),
            LabelReq::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelReq::NotIn(k, vs) => get(k).is_none_or(|x| vs.iter().all(|v| v != x)),
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::NotExists(k) => get(k).is_none(),
            LabelReq::Gt(k, n) => get(k)
                .and_then(|x| x.parse::<i64>().ok())
                .is_some_and(|x| x > *n),
            LabelReq::Lt(k, n) => get(k)
                .and_then(|x| x.parse::<i64>().ok())
                .is_some_and(|x| x < *n),
        })
    }
}

/// A parsed field selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct FieldSelector {
    /// (dotted path, value, equal?)
    reqs: Vec<(String, String, bool)>,
}

impl FieldSelector {
    /// Parses `s`, accepting `metadata.name`, `metadata.namespace` and the
    /// kind's `selectable` paths.
    pub fn parse(s: &str, selectable: &[String]) -> Result<FieldSelector, ApiError> {
        let mut reqs = Vec::new();
        for term in split_unescaped(s, ',') {
            if term.trim().is_empty() {
                continue;
            }
            let (path, value, eq) = if let Some((p, v)) = split_op(&term, "!=") {
                (p, v, false)
            } else if let Some((p, v)) = split_op(&term, "==") {
                (p, v, true)
            } else if let Some((p, v)) = split_op(&term, "=") {
                (p, v, true)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid field selector: {term:?}: expected an operator (=, ==, !=)"
                )));
            };
            let path = path.trim().to_string();
            if path != "metadata.name"
                && path != "metadata.namespace"
                && !selectable.contains(&path)
            {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {path}"
                )));
            }
            reqs.push((path, unescape(&value), eq));
        }
        Ok(FieldSelector { reqs })
    }

    /// Whether an object matches.
    pub fn matches(&self, object: &Value) -> bool {
        self.reqs.iter().all(|(path, want, eq)| {
            let pointer = format!("/{}", path.replace('.', "/"));
            let got = match object.pointer(&pointer) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Bool(b)) => b.to_string(),
                Some(Value::Number(n)) => n.to_string(),
                _ => String::new(),
            };
            (got == *want) == *eq
        })
    }
}

/// Splits on `sep` where it is not escaped with `\`.
fn split_unescaped(s: &str, sep: char) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut escaped = false;
    for c in s.chars() {
        if escaped {
            out.last_mut().unwrap().push('\\');
            out.last_mut().unwrap().push(c);
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == sep {
            out.push(String::new());
        } else {
            out.last_mut().unwrap().push(c);
        }
    }
    out
}

/// Splits `term` at the first unescaped `op`.
fn split_op(term: &str, op: &str) -> Option<(String, String)> {
    let bytes = term.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' {
            i += 2;
            continue;
        }
        if term[i..].starts_with(op) {
            // `=` must not be the tail of `!=` or the head of `==`.
            if op == "=" && (term[i..].starts_with("==") || (i > 0 && bytes[i - 1] == b'!')) {
                return None;
            }
            return Some((term[..i].to_string(), term[i + op.len()..].to_string()));
        }
        i += 1;
    }
    None
}

fn unescape(s: &str) -> String {
    let mut out = String::new();
    let mut escaped = false;
    for c in s.chars() {
        if escaped || c != '\\' {
            out.push(c);
            escaped = false;
        } else {
            escaped = true;
        }
    }
    out
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name of at
/// most 63 characters.
pub(crate) fn validate_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix
        && (p.is_empty() || p.len() > 253 || !is_dns_subdomain(p))
    {
        return Err(format!(
            "prefix part of {key:?} must be a DNS subdomain (lower case alphanumerics, '-' and '.')"
        ));
    }
    if name.is_empty() || name.len() > 63 || !is_qualified_name_part(name) {
        return Err(format!(
            "name part of {key:?} must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (at most 63)"
        ));
    }
    Ok(())
}

/// A label value: empty, or at most 63 characters of the name alphabet.
pub(crate) fn validate_label_value(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Ok(());
    }
    if value.len() > 63 || !is_qualified_name_part(value) {
        return Err(format!(
            "a valid label value {value:?} must be 63 characters or less and must be empty or begin and end with an alphanumeric character with '-', '_' or '.' between"
        ));
    }
    Ok(())
}

fn is_qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// RFC 1123 subdomain: lower-case labels of alphanumerics and `-`, joined
/// by `.`.
pub(crate) fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(|l| is_dns_label_chars(l, 253))
}

/// RFC 1123 label: at most 63 lower-case alphanumerics and `-`, starting and
/// ending with an alphanumeric.
pub(crate) fn is_dns_label(s: &str) -> bool {
    is_dns_label_chars(s, 63)
}

fn is_dns_label_chars(s: &str, max: usize) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= max
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({ "metadata": { "name": "a", "namespace": "ns", "labels": labels },
                "spec": { "nodeName": "n1", "on": true } })
    }

    #[test]
    fn label_selectors_match_as_apimachinery_does() {
        let o = obj(json!({ "app": "web", "tier": "front", "n": "5" }));
        let yes = [
            "",
            "app=web",
            "app==web",
            "app!=db",
            "missing!=x",
            "app in (web, db)",
            "app notin (db)",
            "missing notin (db)",
            "app",
            "!missing",
            "app=web,tier=front",
            " app = web , tier ",
            "n>4",
            "n<6",
            "example.com/x!=y",
        ];
        for s in yes {
            assert!(LabelSelector::parse(s).unwrap().matches(&o), "{s:?}");
        }
        let no = [
            "app=db",
            "app!=web",
            "app in (db)",
            "app notin (web)",
            "missing",
            "!app",
            "app=web,tier=back",
            "n>5",
            "missing in (x)",
        ];
        for s in no {
            assert!(!LabelSelector::parse(s).unwrap().matches(&o), "{s:?}");
        }
        let empty_labels = json!({ "metadata": { "name": "a" } });
        assert!(LabelSelector::parse("a!=b").unwrap().matches(&empty_labels));
        assert!(!LabelSelector::parse("a").unwrap().matches(&empty_labels));
    }

    #[test]
    fn bad_label_selectors_are_400() {
        for s in [
            "app in (a",
            "app ~ b",
            "=x",
            "app=web,",
            "n>x",
            "Bad Key=1",
            "a=b c",
        ] {
            let err = LabelSelector::parse(s).unwrap_err();
            assert_eq!(err.code, 400, "{s:?}");
        }
    }

    #[test]
    fn field_selectors_on_name_namespace_and_declared_fields() {
        let o = obj(json!({}));
        let pods = vec!["spec.nodeName".to_string(), "spec.on".to_string()];
        for s in [
            "metadata.name=a",
            "metadata.name==a",
            "metadata.namespace!=other",
            "spec.nodeName=n1,metadata.name=a",
            "spec.on=true",
        ] {
            assert!(FieldSelector::parse(s, &pods).unwrap().matches(&o), "{s:?}");
        }
        for s in [
            "metadata.name=b",
            "metadata.namespace!=ns",
            "spec.nodeName=",
        ] {
            assert!(
                !FieldSelector::parse(s, &pods).unwrap().matches(&o),
                "{s:?}"
            );
        }
        assert_eq!(
            FieldSelector::parse("spec.other=x", &pods)
                .unwrap_err()
                .code,
            400
        );
        assert_eq!(
            FieldSelector::parse("metadata.name", &pods)
                .unwrap_err()
                .code,
            400
        );
        let escaped = json!({ "metadata": { "name": "a,b" } });
        assert!(
            FieldSelector::parse(r"metadata.name=a\,b", &[])
                .unwrap()
                .matches(&escaped)
        );
    }

    #[test]
    fn names() {
        assert!(is_dns_subdomain("a.b-c.d"));
        assert!(!is_dns_subdomain("A"));
        assert!(!is_dns_subdomain("a..b"));
        assert!(is_dns_label("abc-1"));
        assert!(!is_dns_label("-a"));
        assert!(!is_dns_label(&"a".repeat(64)));
        assert!(validate_label_key("example.com/name").is_ok());
        assert!(validate_label_key("a/b/c").is_err());
        assert!(validate_label_value("").is_ok());
        assert!(validate_label_value("-x").is_err());
    }
}
