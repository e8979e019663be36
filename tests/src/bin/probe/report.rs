//! What the probes found: each question's answer and details, printed as `PROBE <name>:
//! <answer>` with the details indented below, and written as JSON.

use std::path::Path;

use serde_json::{Value, json};

use crate::Error;
use crate::driver::DriverInfo;

/// The prefix of each answer line (what the comparison with the simulator reads back).
pub(crate) const LINE_PREFIX: &str = "PROBE ";

/// Where a child process sends each observation as it makes it.
type Forward = Box<dyn FnMut(&str, &str)>;

/// Named observations, in the order they were made. A child process forwards each to its
/// parent as it is made (see [`crate::child`]), so that a crash keeps what came before it.
#[derive(Default)]
pub(crate) struct Details {
    items: Vec<(String, String)>,
    forward: Option<Forward>,
}

impl Details {
    /// Details that pass each observation to `forward` as well.
    pub(crate) fn forwarding(forward: impl FnMut(&str, &str) + 'static) -> Details {
        Details { items: Vec::new(), forward: Some(Box::new(forward)) }
    }

    /// Records `key: value` (one line; line breaks become spaces).
    pub(crate) fn put(&mut self, key: impl Into<String>, value: impl ToString) {
        let key = key.into();
        let value = value.to_string().replace(['\n', '\r', '\t'], " ");
        if let Some(forward) = &mut self.forward {
            forward(&key, &value);
        }
        self.items.push((key, value));
    }

    /// The value recorded last under `key`.
    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.items.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// Records every item of `other`, its keys prefixed with `prefix` and a dot.
    pub(crate) fn absorb(&mut self, prefix: &str, other: Details) {
        for (key, value) in other.items {
            self.put(format!("{prefix}.{key}"), value);
        }
    }

    /// The items, in order.
    pub(crate) fn items(&self) -> &[(String, String)] {
        &self.items
    }
}

/// One question as the report shows it.
pub(crate) struct Record {
    /// The probe's name.
    pub(crate) name: &'static str,
    /// The question, in words.
    pub(crate) question: &'static str,
    /// The answer, or `error: …` when the probe could not answer.
    pub(crate) answer: String,
    /// Whether the probe answered (no error stopped it).
    pub(crate) answered: bool,
    /// How long it took.
    pub(crate) seconds: f64,
    /// What the answer was drawn from (releases that failed included).
    pub(crate) details: Details,
    /// On a GPU, the simulator's answer to the same question, when it was asked.
    pub(crate) simulator_answer: Option<String>,
}

impl Record {
    /// Prints the answer line and the details below it.
    pub(crate) fn print(&self) {
        println!("{LINE_PREFIX}{}: {}", self.name, self.answer);
        for (key, value) in self.details.items() {
            println!("    {key}: {value}");
        }
    }

    /// The record as a JSON object; the simulator's answer only where it was asked.
    fn json(&self) -> Value {
        let details: serde_json::Map<String, Value> =
            self.details.items().iter().map(|(k, v)| (k.clone(), Value::from(v.as_str()))).collect();
        let mut record = json!({
            "name": self.name,
            "question": self.question,
            "answer": self.answer,
            "answered": self.answered,
            "seconds": (self.seconds * 1000.0).round() / 1000.0,
            "details": details,
        });
        if let (Some(simulator), Some(fields)) = (&self.simulator_answer, record.as_object_mut()) {
            fields.insert("simulator_answer".into(), json!(simulator));
            fields.insert("agrees_with_simulator".into(), json!(*simulator == self.answer));
        }
        record
    }
}

/// The whole run.
pub(crate) struct Report {
    /// The driver the probes ran on.
    pub(crate) driver: DriverInfo,
    /// The simulator library asked the same questions (on a GPU), and its report's file name.
    pub(crate) compared_with: Option<(String, String)>,
    /// Each question.
    pub(crate) records: Vec<Record>,
}

impl Report {
    /// The report as JSON, indented (`Value`'s alternate display is `serde_json`'s pretty
    /// printer).
    pub(crate) fn json(&self) -> String {
        let compared_with =
            self.compared_with.as_ref().map(|(library, report)| json!({"simulator": library, "report": report}));
        let probes: Vec<Value> = self.records.iter().map(Record::json).collect();
        let report = json!({"driver": self.driver.json(), "compared_with": compared_with, "probes": probes});
        format!("{report:#}\n")
    }

    /// Writes the JSON to `path`, creating its folder.
    pub(crate) fn write(&self, path: &Path) -> Result<(), Error> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        }
        std::fs::write(path, self.json()).map_err(|e| format!("writing {}: {e}", path.display()).into())
    }
}

/// The answers in the output of another run of this program: `name → answer` for each line
/// that starts with [`LINE_PREFIX`].
pub(crate) fn parse_answers(output: &str) -> Vec<(String, String)> {
    output
        .lines()
        .filter_map(|line| line.strip_prefix(LINE_PREFIX))
        .filter_map(|rest| rest.split_once(": "))
        .map(|(name, answer)| (name.to_string(), answer.to_string()))
        .collect()
}
