//! What the probes found: each question's answer and details, printed as `PROBE <name>:
//! <answer>` with the details indented below, and written as JSON.

use std::fmt::Write as _;
use std::path::Path;

use tests::output::json_escape;

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

    fn json(&self) -> String {
        let details: Vec<String> = self
            .details
            .items()
            .iter()
            .map(|(k, v)| format!(r#"        "{}": "{}""#, json_escape(k), json_escape(v)))
            .collect();
        let mut out = String::from("    {\n");
        let _ = writeln!(out, r#"      "name": "{}","#, json_escape(self.name));
        let _ = writeln!(out, r#"      "question": "{}","#, json_escape(self.question));
        let _ = writeln!(out, r#"      "answer": "{}","#, json_escape(&self.answer));
        let _ = writeln!(out, r#"      "answered": {},"#, self.answered);
        let _ = writeln!(out, r#"      "seconds": {:.3},"#, self.seconds);
        if let Some(simulator) = &self.simulator_answer {
            let _ = writeln!(out, r#"      "simulator_answer": "{}","#, json_escape(simulator));
            let _ = writeln!(out, r#"      "agrees_with_simulator": {},"#, *simulator == self.answer);
        }
        let _ = write!(out, "      \"details\": {{\n{}\n      }}\n    }}", details.join(",\n"));
        out
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
    /// The report as JSON.
    pub(crate) fn json(&self) -> String {
        let mut out = String::from("{\n");
        let _ = writeln!(out, "  \"driver\": {},", self.driver.json());
        match &self.compared_with {
            Some((library, report)) => {
                let _ = writeln!(
                    out,
                    r#"  "compared_with": {{"simulator": "{}", "report": "{}"}},"#,
                    json_escape(library),
                    json_escape(report)
                );
            }
            None => out.push_str("  \"compared_with\": null,\n"),
        }
        let records: Vec<String> = self.records.iter().map(Record::json).collect();
        let _ = write!(out, "  \"probes\": [\n{}\n  ]\n}}\n", records.join(",\n"));
        out
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
