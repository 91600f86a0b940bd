//! What a response costs on the wire: a unary response whose message is under 1 KiB leaves the
//! server in one write (HEADERS, DATA and trailers together), a larger one in no more than two.
//! Counted at the client's end of a real TCP connection to the server: `TCP_INFO`'s
//! `tcpi_data_segs_in`, the segments that carried data (acknowledgements are not counted). With
//! `TCP_NODELAY`, as the server sets it, each write of a response this small is one segment.

use std::os::fd::{AsRawFd, RawFd};

use hyper_util::rt::TokioIo;
use prost::Message;
use tonic::transport::{Endpoint, Uri};
use toolgate::proto::{ToolStatus, tool_gate_client::ToolGateClient};

use crate::support::{TestServer, call, execute_request, who};

const CATALOG: &str = r#"version: 1
identity: { dev_identity: true }
tenants: { acme: {} }
tools:
  - { name: echo, description: Echo., risk_level: read_only, executor: { builtin: echo }, input_schema: { type: object, properties: { text: { type: string } } } }
"#;

/// Segments with data this socket has received so far.
#[expect(unsafe_code, reason = "TCP_INFO has no safe wrapper")]
fn data_segments_in(fd: RawFd) -> u32 {
    // SAFETY: `tcp_info` is plain integers, so all zeroes is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `info`, and `fd` is a TCP socket the
    // caller keeps open.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    assert_eq!(rc, 0, "TCP_INFO: {}", std::io::Error::last_os_error());
    info.tcpi_data_segs_in
}

#[tokio::test]
async fn a_response_under_a_kilobyte_leaves_the_server_in_one_write() {
    let server = TestServer::start(CATALOG).await;
    let stream = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let fd = stream.as_raw_fd();
    let mut stream = Some(stream);
    let channel = Endpoint::try_from("http://127.0.0.1")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let stream = stream.take().ok_or(std::io::ErrorKind::NotConnected);
            async move { Ok::<_, std::io::Error>(TokioIo::new(stream?)) }
        }))
        .await
        .expect("connect");
    let mut client = ToolGateClient::new(channel);
    let mut execute = async |text: &str| {
        let arguments = serde_json::json!({ "text": text }).to_string();
        let request = who("acme").request(execute_request(call("echo", &arguments)));
        let response = client.execute_tool(request).await.unwrap().into_inner();
        let result = response.result.as_ref().expect("a result");
        assert_eq!(result.status(), ToolStatus::Ok, "{result:?}");
        assert_eq!(result.model_text, text);
        response.encoded_len()
    };
    // The connection's settings are exchanged before any count is taken.
    execute("warm").await;

    const CALLS: u32 = 20;
    // (text, the size of the message it makes: at least, below, writes per call at most)
    let cases = [
        ("x".repeat(500), 256, 1024, 1),
        ("x".repeat(2500), 1024, 4096, 2),
        ("x".repeat(6000), 4096, 16384, 2),
    ];
    for (text, at_least, below, writes) in cases {
        let before = data_segments_in(fd);
        for _ in 0..CALLS {
            let size = execute(&text).await;
            assert!(
                (at_least..below).contains(&size),
                "the response is {size} bytes, meant to be in {at_least}..{below}"
            );
        }
        let segments = data_segments_in(fd) - before;
        assert!(
            segments <= CALLS * writes,
            "{CALLS} responses of {at_least}..{below} bytes came in {segments} segments, \
             at most {writes} each expected"
        );
    }
}
