//! [`gorge_testkit::RefusedPort`] refuses connections, and no one else can take its port
//! while it is held.

use std::io::ErrorKind;
use std::net::{TcpListener, TcpStream};

use gorge_testkit::RefusedPort;

#[test]
fn a_refused_port_refuses_and_cannot_be_taken() {
    let refused = RefusedPort::new();
    let addr = format!("127.0.0.1:{}", refused.port());
    let err = TcpStream::connect(&addr).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused, "{err}");
    // std sets SO_REUSEADDR on its listeners, as tokio does: still refused.
    let err = TcpListener::bind(&addr).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::AddrInUse, "{err}");
    let taken = tokio::net::TcpSocket::new_v4().unwrap();
    taken.set_reuseaddr(true).unwrap();
    assert!(taken.bind(addr.parse().unwrap()).is_err());
}

/// A held port keeps serving through its listener while that lives, then refuses, and no
/// port handed out by the kernel is the held one.
#[tokio::test]
async fn a_held_port_serves_until_its_listener_goes_then_refuses() {
    let listener = tokio::net::TcpSocket::new_v4().unwrap();
    listener.set_reuseport(true).unwrap();
    listener.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr().unwrap();
    let listener = listener.listen(16).unwrap().into_std().unwrap();
    listener.set_nonblocking(false).unwrap();
    let held = RefusedPort::hold(addr.port());
    TcpStream::connect(addr).expect("the listener still gets connections");
    listener
        .accept()
        .expect("accepted by the server's listener");
    drop(listener);
    let err = TcpStream::connect(addr).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused, "{err}");
    let err = TcpListener::bind(addr).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::AddrInUse, "{err}");
    assert_eq!(held.port(), addr.port());
}
