//! The lines `cloister-bench-client --lockstep` prints and `cloister bench` reads
//! (`bench::interleave`): described once here, included by both programs.
//!
//! Before each block of a workload the client prints `LOCKSTEP wait NAME` and waits for a line
//! on its standard input; at its end it prints `LOCKSTEP result {JSON}`. Lines without the
//! prefix (a driver's own messages on standard output) are not the protocol's.

const PREFIX: &str = "LOCKSTEP";

/// Ready for the next block of workload `name`.
pub fn wait_line(name: &str) -> String {
    format!("{PREFIX} wait {name}")
}

/// The whole run's document.
pub fn result_line(doc: &str) -> String {
    format!("{PREFIX} result {doc}")
}

/// What a line says, if it is one of the protocol's.
#[derive(Debug, PartialEq, Eq)]
pub enum Line<'a> {
    Wait(&'a str),
    Result(&'a str),
}

pub fn parse(line: &str) -> Option<Line<'_>> {
    let said = line.trim_end().strip_prefix(PREFIX)?.strip_prefix(' ')?;
    match (said.strip_prefix("wait "), said.strip_prefix("result ")) {
        (Some(name), _) => Some(Line::Wait(name)),
        (_, Some(doc)) => Some(Line::Result(doc)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parse_back_and_others_are_not_the_protocols() {
        assert_eq!(parse(&format!("{}\n", wait_line("read_4k"))), Some(Line::Wait("read_4k")));
        assert_eq!(parse(&result_line("{\"a\": 1}")), Some(Line::Result("{\"a\": 1}")));
        for other in ["a driver talking", "LOCKSTEPwait x", "LOCKSTEP done", "lockstep wait x"] {
            assert_eq!(parse(other), None, "{other}");
        }
    }
}
