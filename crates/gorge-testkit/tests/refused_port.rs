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
