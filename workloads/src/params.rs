//! Parameter overrides from the command line: `--param KEY=VALUE` sets a parameter of every chosen workload that
//! has it, and `--param KEY=V1,V2,...` sweeps it (one case per value).
//!
//! A value is read as JSON when it parses (numbers, `true`, a quoted string, an array), else as a string; a value
//! that is not JSON as a whole and holds commas is a sweep. A key the parameters do not have is skipped here: the
//! runner reports a key that fits no chosen workload.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// One `KEY=VALUE` override, split into the key and its values (more than one: a sweep).
fn parse(o: &str) -> Result<(&str, Vec<serde_json::Value>), String> {
    let (key, value) = o
        .split_once('=')
        .ok_or_else(|| format!("`{o}`: expected KEY=VALUE"))?;
    let key = key.trim();
    if key.is_empty() {
        return Err(format!("`{o}`: expected KEY=VALUE"));
    }
    let one = |v: &str| {
        serde_json::from_str(v.trim())
            .unwrap_or_else(|_| serde_json::Value::String(v.trim().to_string()))
    };
    let values = if serde_json::from_str::<serde_json::Value>(value).is_err() && value.contains(',')
    {
        value.split(',').map(one).collect()
    } else {
        vec![one(value)]
    };
    Ok((key, values))
}

/// The key of an override (`KEY` of `KEY=VALUE`), or the error of a malformed one.
pub fn key(o: &str) -> Result<&str, String> {
    parse(o).map(|(k, _)| k)
}

/// `base` with every override applied that names one of its keys: one case per combination of swept values.
/// A value of the wrong type is an error naming the key.
pub fn apply<P>(base: &P, overrides: &[String]) -> Result<Vec<P>, String>
where
    P: Serialize + DeserializeOwned,
{
    let value = serde_json::to_value(base).map_err(|e| e.to_string())?;
    if !value.is_object() {
        return Err("parameters are not an object".into());
    }
    let mut cases = vec![value];
    for o in overrides {
        let (key, values) = parse(o)?;
        if cases[0].get(key).is_none() {
            continue;
        }
        cases = cases
            .into_iter()
            .flat_map(|case| {
                values.iter().map(move |v| {
                    let mut c = case.clone();
                    c[key] = v.clone();
                    c
                })
            })
            .collect();
    }
    cases
        .into_iter()
        .map(|c| {
            serde_json::from_value(c.clone())
                .map_err(|e| format!("bad parameter value ({e}); parameters: {}", c))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct P {
        orders: u32,
        rtt_ms: u64,
        name: String,
    }

    fn p() -> P {
        P {
            orders: 10,
            rtt_ms: 10,
            name: "x".into(),
        }
    }

    #[test]
    fn set_sweep_and_skip() {
        let cases = apply(&p(), &["orders=500".into(), "nope=1".into()]).unwrap();
        assert_eq!(cases, vec![P { orders: 500, ..p() }]);
        let cases = apply(&p(), &["rtt_ms=10,50,100".into(), "orders=1,2".into()]).unwrap();
        assert_eq!(cases.len(), 6);
        assert_eq!(
            cases[5],
            P {
                orders: 2,
                rtt_ms: 100,
                ..p()
            }
        );
        let named = apply(&p(), &["name=a b".into()]).unwrap();
        assert_eq!(named[0].name, "a b");
    }

    #[test]
    fn bad_values_and_forms_are_errors() {
        assert!(apply(&p(), &["orders=many".into()])
            .unwrap_err()
            .contains("bad parameter value"));
        assert!(apply(&p(), &["orders".into()]).is_err());
        assert!(key("=3").is_err());
        assert_eq!(key("orders=3").unwrap(), "orders");
    }
}
