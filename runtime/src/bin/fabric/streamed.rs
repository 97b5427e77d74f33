//! `fabric run --stream`: the text of the stages that stream, on stdout as the model writes it.
//! The library's [`TextFollower`] says what each event changes; this prints it. Each call's text
//! is followed by one newline (at its end, at a restart, or when another call's text comes in
//! between); stderr gets a header when a call's text begins and a marker when it restarts
//! (none with `--events-out -`, whose events already say so on stderr).

use std::sync::Mutex;

use fabric::events::{Event, EventSink};
use fabric::llm::stream::{Shown, TextFollower};

use crate::term::{print_out, say};

/// An event sink that prints the streamed text.
pub struct Streamed {
    /// Whether headers and restart markers go to stderr.
    notes: bool,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    follower: TextFollower,
    /// The first failure to write stdout: nothing more is written after it.
    failure: Option<std::io::Error>,
}

impl Streamed {
    pub fn new(notes: bool) -> Streamed {
        Streamed { notes, state: Mutex::new(State::default()) }
    }

    /// Why stdout could not be written, if it could not.
    pub fn failure(&self) -> Option<String> {
        self.state.lock().ok()?.failure.as_ref().map(ToString::to_string)
    }
}

/// The header of a call's text on stderr.
fn header(stage_id: &str, turn: u32, again: bool, parent_run_id: Option<&str>) -> String {
    let child = parent_run_id.map_or(String::new(), |_| " (child run)".to_owned());
    let turn = if turn > 0 { format!(", turn {turn}") } else { String::new() };
    let again = if again { " (continued)" } else { "" };
    format!("── stage {stage_id}{child}{turn}{again} ──")
}

impl EventSink for Streamed {
    fn emit(&self, e: &Event) {
        let Ok(mut state) = self.state.lock() else { return };
        if state.failure.is_some() {
            return;
        }
        for shown in state.follower.follow(e) {
            let printed = match shown {
                Shown::Begins { stage_id, turn, again, parent_run_id } => {
                    if self.notes {
                        say(header(stage_id, turn, again, parent_run_id));
                    }
                    Ok(())
                }
                Shown::Text(text) => print_out(text),
                Shown::Restarted { stage_id, attempt, .. } => {
                    let ended = print_out("\n");
                    if self.notes {
                        say(format_args!("── stage {stage_id}: restarted (attempt {attempt}): drop the text above; it is written again below ──"));
                    }
                    ended
                }
                Shown::Ends => print_out("\n"),
            };
            if let Err(e) = printed {
                state.failure = Some(e);
                return;
            }
        }
    }
}
