//! Tagged output ([`Launch::tag_output`]): each PE's stdout and stderr are
//! pipes, copied line by line by a thread each, every line prefixed with
//! `[rank] ` and written whole, so that lines of different PEs do not mix.
//!
//! [`Launch::tag_output`]: super::Launch::tag_output

#[cfg(test)]
use super::lock;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::sync::mpsc::Sender;
#[cfg(test)]
use std::sync::{Arc, Mutex};
use std::thread;

/// Where tagged output goes.
pub(super) enum Sink {
    Stdout,
    Stderr,
    /// Tests collect the lines here.
    #[cfg(test)]
    Buffer(Arc<Mutex<Vec<u8>>>),
}

impl Sink {
    /// Writes one whole line.
    fn write_line(&self, line: &[u8]) {
        // Errors (a closed stdout) are ignored: the pipe must still be
        // drained so that the PE does not block.
        match self {
            Sink::Stdout => {
                let mut out = io::stdout().lock();
                let _ = out.write_all(line).and_then(|()| out.flush());
            }
            Sink::Stderr => {
                let _ = io::stderr().lock().write_all(line);
            }
            #[cfg(test)]
            Sink::Buffer(buf) => lock(buf).extend_from_slice(line),
        }
    }
}

/// Starts a thread that copies `from` to `sink`, tagged with `rank`, and
/// sends on `done` once `from` is closed.
pub(super) fn spawn_forwarder(
    rank: usize,
    from: impl Read + Send + 'static,
    sink: Sink,
    done: &Sender<()>,
) -> io::Result<()> {
    let done = done.clone();
    thread::Builder::new()
        .name(format!("shmem-output-{rank}"))
        .spawn(move || {
            forward_lines(rank, from, &sink);
            let _ = done.send(());
        })
        .map(drop)
}

/// Copies `from` to `sink` line by line, each prefixed with `[rank] `; a
/// last line without a newline gets one.
fn forward_lines(rank: usize, from: impl Read, sink: &Sink) {
    let prefix = format!("[{rank}] ");
    let mut reader = BufReader::new(from);
    let mut line = Vec::new();
    loop {
        line.clear();
        line.extend_from_slice(prefix.as_bytes());
        match reader.read_until(b'\n', &mut line) {
            Ok(0) => return,
            Ok(_) => {
                if !line.ends_with(b"\n") {
                    line.push(b'\n');
                }
                sink.write_line(&line);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forward_lines_tags_every_line() {
        let buf = Arc::new(Mutex::new(Vec::new()));
        forward_lines(7, &b"a\n\nb\xff\nlast"[..], &Sink::Buffer(buf.clone()));
        assert_eq!(&*lock(&buf), b"[7] a\n[7] \n[7] b\xff\n[7] last\n");
    }
}
