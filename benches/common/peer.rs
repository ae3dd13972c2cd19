//! Running a peer's timing script (numpy, PyTorch) from a benchmark: one flat JSON object of
//! case name -> seconds on stdout, parsed by hand to avoid a dependency.

use std::collections::HashMap;

/// Runs `python script args...` and parses its output.
pub fn run(python: &str, script: &str, args: &[String]) -> Result<HashMap<String, f64>, String> {
    let out = std::process::Command::new(python)
        .arg(script)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {python}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{python} {script} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let body = text.trim().trim_start_matches('{').trim_end_matches('}');
    // Keys may hold commas ("conv2d 3x3, ..."), so entries are split at `, "`.
    body.split(", \"")
        .map(|kv| {
            let (k, v) = kv
                .rsplit_once(": ")
                .ok_or_else(|| format!("bad JSON from {script}"))?;
            Ok((
                k.trim_matches('"').to_string(),
                v.trim().parse::<f64>().map_err(|e| e.to_string())?,
            ))
        })
        .collect()
}
