//! Reading the `--check-config` report both services print (it is written by gorge-service):
//! one `NAME = VALUE  # SOURCE` line per setting, and `warning: …` lines.

/// The value `--check-config` printed for `name`, and its source. Panics, showing the whole
/// report, when `name` is not in it.
pub fn checked(stdout: &str, name: &str) -> (String, String) {
    stdout
        .lines()
        .find_map(|line| {
            let (left, right) = line.split_once(" = ")?;
            (left.trim_end() == name).then_some(right)
        })
        .and_then(|right| right.rsplit_once("  # "))
        .map(|(value, source)| (value.to_string(), source.to_string()))
        .unwrap_or_else(|| panic!("{name} not in\n{stdout}"))
}

/// The `warning: …` lines of the report, in order.
pub fn warnings(stdout: &str) -> Vec<String> {
    stdout
        .lines()
        .filter(|line| line.starts_with("warning: "))
        .map(str::to_string)
        .collect()
}
