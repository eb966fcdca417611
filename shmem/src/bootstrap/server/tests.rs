//! The rendezvous server's tests: its life and its run phase, with
//! clients on threads of this process.

use super::*;
use crate::bootstrap::relay::Incoming;
use crate::bootstrap::tcp::Client;

#[test]
#[cfg_attr(miri, ignore = "Miri: no sockets (a rendezvous server)")]
fn server_runs_many_times() {
    for _ in 0..20 {
        let server = RendezvousServer::start(2).unwrap();
        // A stray connection that never says hello must not keep the
        // server from stopping.
        let _stray = TcpStream::connect(server.addr()).unwrap();
        server.shutdown();
    }
    let server = RendezvousServer::start(1).unwrap();
    let tok = server.token();
    let mut c = Client::connect(&server.addr().to_string(), 0, 1, &tok, Duration::from_secs(2)).unwrap();
    assert_eq!(c.allgather(b"z").unwrap(), vec![b"z".to_vec()]);
    drop(server); // drop stops it too
    assert!(c.allgather(b"z").is_err());
}

const T: Duration = Duration::from_secs(10);

/// Connects PEs `ranks` of a job of `n` on threads, each running `body`.
fn pes<R: Send + 'static>(
    server: &RendezvousServer,
    n: usize,
    body: impl Fn(Client) -> R + Send + Clone + 'static,
) -> Vec<JoinHandle<R>> {
    let (addr, token) = (server.addr().to_string(), server.token());
    (0..n)
        .map(|rank| {
            let (addr, body) = (addr.clone(), body.clone());
            thread::spawn(move || body(Client::connect(&addr, rank, n, &token, T).unwrap()))
        })
        .collect()
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + T;
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        thread::sleep(Duration::from_millis(2));
    }
}

#[test]
#[cfg_attr(miri, ignore = "Miri: no sockets (a rendezvous server)")]
fn the_server_runs_while_a_pe_is_connected() {
    let server = RendezvousServer::start(2).unwrap();
    let handles = pes(&server, 2, |mut c| {
        c.allgather(b"x").unwrap();
        c.into_relay().unwrap()
    });
    let mut relays: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let coordinator = &server.threads[1];
    // In the run phase a query is answered with the phase.
    let mut stray = TcpStream::connect(server.addr()).unwrap();
    stray.write_all(&wire::frame(wire::QUERY, &[])).unwrap();
    let (kind, body) = wire::read_frame(&mut stray, |_| Some(wire::MAX_TEXT)).unwrap();
    assert_eq!((kind, wire::parse_status(&body)), (wire::STATUS, Some((wire::PHASE_RUN, 1, vec![]))));
    drop(stray);
    relays.remove(0).close();
    relays[0].send(1, b"to myself").unwrap();
    wait_until("the message to itself", || !relays[0].poll().unwrap().is_empty());
    assert!(!coordinator.is_finished());
    relays.remove(0).close();
    wait_until("the server to stop once every PE left", || coordinator.is_finished());
    server.shutdown();
}

#[test]
#[cfg_attr(miri, ignore = "Miri: no sockets (a rendezvous server)")]
fn goodbyes_of_the_init_phase_are_news_at_the_first_run() {
    let server = RendezvousServer::start(3).unwrap();
    let handles = pes(&server, 3, |mut c| {
        c.allgather(b"x").unwrap();
        if c.rank() == 0 {
            c.close();
            return None;
        }
        Some(c.into_relay().unwrap())
    });
    let mut relays: Vec<_> = handles.into_iter().filter_map(|h| h.join().unwrap()).collect();
    for r in &mut relays {
        let mut got = Vec::new();
        wait_until("news of PE 0", || {
            got.extend(r.poll().unwrap());
            !got.is_empty()
        });
        let text = "PE 0 left (it said goodbye to the launcher)".to_string();
        assert_eq!(got, [Incoming::Gone { rank: 0, died: false, text }]);
    }
    server.shutdown();
}

#[test]
#[cfg_attr(miri, ignore = "Miri: no sockets (a rendezvous server)")]
fn an_allgather_that_not_every_pe_joins_fails() {
    // One PE ends its init, the other gathers once more.
    let server = RendezvousServer::start(2).unwrap();
    let handles = pes(&server, 2, |mut c| {
        c.allgather(b"x").unwrap();
        match c.rank() {
            0 => Ok(c.into_relay().unwrap()),
            _ => {
                thread::sleep(Duration::from_millis(100));
                Err(c.allgather(b"y").unwrap_err().to_string())
            }
        }
    });
    let mut results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let e = results.pop().unwrap().unwrap_err();
    assert!(e.contains("PE 0 ended its init before allgather #2"), "{e}");
    assert!(e.contains("different number of times"), "{e}");
    // PE 1 has said goodbye since: PE 0 hears that it left.
    let mut relay = results.pop().unwrap().unwrap();
    let mut got = Vec::new();
    wait_until("news of PE 1", || {
        got.extend(relay.poll().unwrap());
        !got.is_empty()
    });
    assert!(matches!(got[..], [Incoming::Gone { rank: 1, died: false, .. }]), "{got:?}");
    server.shutdown();

    // One PE ends its init while the other is in an allgather.
    let server = RendezvousServer::start(2).unwrap();
    let handles = pes(&server, 2, |mut c| match c.rank() {
        0 => Err(c.allgather(b"x").unwrap_err().to_string()),
        _ => {
            thread::sleep(Duration::from_millis(100));
            Ok(c.into_relay().unwrap())
        }
    });
    let mut results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let mut relay = results.pop().unwrap().unwrap();
    let e = results.pop().unwrap().unwrap_err();
    assert!(e.contains("PE 1 ended its init"), "{e}");
    assert!(e.contains("different number of times"), "{e}");
    // The relay hears of the failure (unless its RUN came first).
    if e.contains("during allgather #1") {
        let mut failure = None;
        wait_until("the failure", || {
            failure = relay.poll().err();
            failure.is_some()
        });
        assert!(failure.unwrap().to_string().contains("PE 1 ended its init during allgather #1"));
    }
    server.shutdown();
}
