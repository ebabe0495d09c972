//! The figures of a sitting: one [`Row`] per implementation, workload and
//! figure, printed as a table and written as JSON, and the CPU they were
//! taken on ([`machine`]).

/// One figure of one implementation on one workload, one sample per run.
pub struct Row {
    pub imp: String,
    pub workload: String,
    pub figure: &'static str,
    pub samples: Vec<f64>,
}

impl Row {
    pub fn sorted(&self) -> Vec<f64> {
        let mut s = self.samples.clone();
        s.sort_by(f64::total_cmp);
        s
    }
    pub fn min(&self) -> f64 {
        self.sorted()[0]
    }
    pub fn median(&self) -> f64 {
        let s = self.sorted();
        s[s.len() / 2]
    }
    pub fn max(&self) -> f64 {
        *self.sorted().last().expect("a sample")
    }
}

#[derive(Default)]
pub struct Report {
    pub rows: Vec<Row>,
}

impl Report {
    pub fn push(&mut self, imp: &str, workload: &str, figure: &'static str, sample: f64) {
        match self
            .rows
            .iter_mut()
            .find(|r| r.imp == imp && r.workload == workload && r.figure == figure)
        {
            Some(row) => row.samples.push(sample),
            None => self.rows.push(Row {
                imp: imp.to_string(),
                workload: workload.to_string(),
                figure,
                samples: vec![sample],
            }),
        }
    }

    pub fn median(&self, imp: &str, workload: &str, figure: &str) -> Option<f64> {
        self.rows
            .iter()
            .find(|r| r.imp == imp && r.workload == workload && r.figure == figure)
            .map(Row::median)
    }

    pub fn print_table(&self) {
        println!(
            "\n{:<10} {:<24} {:<38} {:>12} {:>12} {:>12}",
            "workload", "figure", "impl", "median", "min", "max"
        );
        println!("{}", "-".repeat(113));
        for r in &self.rows {
            println!(
                "{:<10} {:<24} {:<38} {:>12} {:>12} {:>12}",
                r.workload,
                r.figure,
                r.imp,
                fmt_num(r.median()),
                fmt_num(r.min()),
                fmt_num(r.max())
            );
        }
    }

    pub fn write_json(&self, file: &str) -> std::io::Result<std::path::PathBuf> {
        let rows: Vec<_> = self
            .rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "impl": r.imp,
                    "workload": r.workload,
                    "figure": r.figure,
                    "min": r.min(),
                    "median": r.median(),
                    "max": r.max(),
                })
            })
            .collect();
        let dir = crate::settings::target_dir();
        std::fs::create_dir_all(&dir)?;
        let path = dir.join(file);
        let text = serde_json::to_string_pretty(&rows).expect("rows serialize");
        std::fs::write(&path, text + "\n")?;
        Ok(path)
    }
}

pub fn fmt_num(x: f64) -> String {
    if x.abs() >= 1e6 {
        format!("{:.2}M", x / 1e6)
    } else if x.abs() >= 1e4 {
        format!("{:.1}k", x / 1e3)
    } else if x.abs() >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.4}")
    }
}

/// The CPU the run is on, from `/proc/cpuinfo` (what `lscpu` reads): on
/// x86 its model name, vendor, family and model numbers and whether a
/// hypervisor runs the machine, elsewhere what the file names (on Arm its
/// implementer and part numbers), and how many logical CPUs there are.
/// Printed with the verdicts, since a ratio to another queue depends on
/// the CPU as well.
pub fn machine() -> String {
    let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else {
        return "unknown (no /proc/cpuinfo)".into();
    };
    let field = |name: &str| {
        info.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == name).then(|| v.trim().to_string())
        })
    };
    let cpus = info
        .lines()
        .filter(|l| l.split(':').next().is_some_and(|k| k.trim() == "processor"))
        .count();
    let mut about = Vec::new();
    for (label, name) in [
        ("", "vendor_id"),
        ("family ", "cpu family"),
        ("model ", "model"),
        ("implementer ", "CPU implementer"),
        ("part ", "CPU part"),
    ] {
        if let Some(v) = field(name) {
            about.push(format!("{label}{v}"));
        }
    }
    let model = field("model name").unwrap_or_else(|| "CPU".into());
    let about = if about.is_empty() {
        String::new()
    } else {
        format!(" ({})", about.join(" "))
    };
    let flags = field("flags")
        .or_else(|| field("Features"))
        .unwrap_or_default();
    let virtual_machine = flags.split_whitespace().any(|f| f == "hypervisor");
    let under = if virtual_machine {
        ", under a hypervisor"
    } else {
        ""
    };
    format!("{model}{about}, {cpus} logical CPUs{under}")
}
