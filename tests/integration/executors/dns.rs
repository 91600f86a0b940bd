//! A real DNS answer pointing at a private address is refused before connecting.
//!
//! toolgate resolves upstream hosts with the system resolver (`getaddrinfo`, through tokio's
//! `lookup_host`), which takes its name servers from /etc/resolv.conf; it has no setting for a
//! DNS server of its own, and a process cannot point glibc at another resolv.conf. So the test
//! re-runs itself inside new user, mount and network namespaces (`unshare -rmn`, no real root
//! needed): there, loopback is its own, /etc/resolv.conf is bind-mounted to name a tiny DNS server
//! the test runs on 127.0.0.1:53, and the real server resolves `svc.corp.test` through it.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use toolgate::proto::ToolStatus;

use crate::support::{TestServer, call, exec, test_name, who};

const CHILD: &str = "TOOLGATE_DNS_TEST_CHILD";
const NAME: &str = "svc.corp.test";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_dns_answer_with_a_private_address_is_refused_before_connecting() {
    if std::env::var_os(CHILD).is_none() {
        let out = tokio::time::timeout(
            Duration::from_secs(120),
            tokio::process::Command::new("unshare")
                .args(["--user", "--map-root-user", "--mount", "--net", "--"])
                .arg(std::env::current_exe().unwrap())
                .args([
                    &test_name(
                        module_path!(),
                        "a_real_dns_answer_with_a_private_address_is_refused_before_connecting",
                    ),
                    "--exact",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD, "1")
                .kill_on_drop(true)
                .output(),
        )
        .await
        .expect("the namespaced run finishes")
        .expect(
            "unshare (util-linux) runs; it needs unprivileged user namespaces \
             (sysctl kernel.unprivileged_userns_clone=1 where that exists)",
        );
        let report = format!(
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{report}");
        assert!(
            report.contains("1 passed"),
            "the test did not run: {report}"
        );
        return;
    }
    in_namespaces().await;
}

async fn in_namespaces() {
    loopback_up();
    let dir = tempfile::tempdir().unwrap();
    let resolv = dir.path().join("resolv.conf");
    std::fs::write(
        &resolv,
        "nameserver 127.0.0.1\noptions timeout:2 attempts:2\n",
    )
    .unwrap();
    let nsswitch = dir.path().join("nsswitch.conf");
    std::fs::write(&nsswitch, "hosts: files dns\n").unwrap();
    bind_mount(&resolv, "/etc/resolv.conf");
    bind_mount(&nsswitch, "/etc/nsswitch.conf");

    let queries = dns_server().await;
    // Behind the guarded upstream: a listener that only counts connections.
    let counting = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let counting_port = counting.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    tokio::spawn({
        let accepted = accepted.clone();
        async move {
            while counting.accept().await.is_ok() {
                accepted.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    // Behind the open upstream: a real HTTP server.
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http_port = http.local_addr().unwrap().port();
    let app = axum::Router::new().route("/", axum::routing::post(|| async { "\"reached\"" }));
    tokio::spawn(async move { axum::serve(http, app).await.unwrap() });

    let yaml = format!(
        r#"version: 1
identity: {{ dev_identity: true }}
tenants: {{ acme: {{}} }}
upstreams:
  guarded: {{ url: "http://{NAME}:{counting_port}", allow_schemes: [http] }}
  open: {{ url: "http://{NAME}:{http_port}", allow_schemes: [http], allow_private_addresses: true }}
tools:
  - {{ name: guarded, description: d, risk_level: read_only, timeout: 10s, executor: {{ http: {{ upstream: guarded }} }}, input_schema: {{ type: object }} }}
  - {{ name: open, description: d, risk_level: read_only, timeout: 10s, executor: {{ http: {{ upstream: open }} }}, input_schema: {{ type: object }} }}
"#
    );
    let server = TestServer::start(&yaml).await;
    let mut client = server.client().await;
    let r = exec(&mut client, &who("acme"), call("guarded", "{}")).await;
    assert_eq!(
        (r.status(), r.error_type.as_str()),
        (ToolStatus::Denied, "destination_refused"),
        "{r:?}"
    );
    assert!(r.error_message.contains("loopback"), "{}", r.error_message);
    assert!(
        queries.load(Ordering::SeqCst) >= 1,
        "the name was not resolved through the DNS server"
    );
    assert_eq!(accepted.load(Ordering::SeqCst), 0, "connected anyway");
    // Control: the same answer, for an upstream that allows private addresses, is connected to.
    let r = exec(&mut client, &who("acme"), call("open", "{}")).await;
    assert_eq!(
        (r.status(), r.model_text.as_str()),
        (ToolStatus::Ok, "\"reached\""),
        "{r:?}"
    );
    server.stop().await;
}

/// Sets IFF_UP on `lo`: a new network namespace starts with its loopback down.
#[expect(unsafe_code, reason = "SIOCSIFFLAGS has no safe wrapper")]
fn loopback_up() {
    // SAFETY: plain ioctls on a socket of our own with a zeroed, correctly sized ifreq.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let mut request: libc::ifreq = std::mem::zeroed();
        for (slot, byte) in request.ifr_name.iter_mut().zip(b"lo\0") {
            *slot = *byte as libc::c_char;
        }
        assert_eq!(
            libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut request),
            0,
            "SIOCGIFFLAGS: {}",
            std::io::Error::last_os_error()
        );
        request.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        assert_eq!(
            libc::ioctl(fd, libc::SIOCSIFFLAGS, &mut request),
            0,
            "SIOCSIFFLAGS: {}",
            std::io::Error::last_os_error()
        );
        libc::close(fd);
    }
}

#[expect(unsafe_code, reason = "mount(2) has no safe wrapper")]
fn bind_mount(source: &std::path::Path, target: &str) {
    let source = std::ffi::CString::new(source.to_str().unwrap()).unwrap();
    let target_c = std::ffi::CString::new(target).unwrap();
    // SAFETY: mount(2) with valid NUL-terminated paths, in this process's own mount namespace.
    let done = unsafe {
        libc::mount(
            source.as_ptr(),
            target_c.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    };
    assert_eq!(
        done,
        0,
        "bind-mounting {target}: {}",
        std::io::Error::last_os_error()
    );
}

/// A DNS server on 127.0.0.1:53 (UDP) that answers `svc.corp.test IN A` with 127.0.0.1, AAAA
/// with no records, and anything else with NXDOMAIN. Returns the count of A queries for it.
async fn dns_server() -> Arc<AtomicUsize> {
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:53").await.unwrap();
    let queries = Arc::new(AtomicUsize::new(0));
    let counted = queries.clone();
    tokio::spawn(async move {
        let mut buf = [0u8; 512];
        while let Ok((n, from)) = socket.recv_from(&mut buf).await {
            if let Some(answer) = answer(&buf[..n], &counted) {
                let _ = socket.send_to(&answer, from).await;
            }
        }
    });
    queries
}

/// The response to one query (RFC 1035 wire format), or `None` for garbage.
fn answer(query: &[u8], queries: &AtomicUsize) -> Option<Vec<u8>> {
    if query.len() < 12 {
        return None;
    }
    // The question: labels up to the zero byte, then QTYPE and QCLASS.
    let mut at = 12;
    let mut labels = Vec::new();
    loop {
        let len = usize::from(*query.get(at)?);
        at += 1;
        if len == 0 {
            break;
        }
        labels.push(String::from_utf8_lossy(query.get(at..at + len)?).to_ascii_lowercase());
        at += len;
    }
    let qtype = u16::from_be_bytes([*query.get(at)?, *query.get(at + 1)?]);
    let question_end = at + 4;
    let question = query.get(12..question_end)?;
    let ours = labels.join(".") == NAME;
    let a_record = ours && qtype == 1;
    if a_record {
        queries.fetch_add(1, Ordering::SeqCst);
    }
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&query[..2]); // id
    // QR, opcode 0, AA, RD copied; RA; RCODE 0 (ours) or 3 (NXDOMAIN).
    out.push(0x84 | (query[2] & 0x01));
    out.push(0x80 | if ours { 0 } else { 3 });
    out.extend_from_slice(&1u16.to_be_bytes()); // QDCOUNT
    out.extend_from_slice(&u16::from(a_record).to_be_bytes()); // ANCOUNT
    out.extend_from_slice(&[0, 0, 0, 0]); // NSCOUNT, ARCOUNT
    out.extend_from_slice(question);
    if a_record {
        out.extend_from_slice(&[0xc0, 0x0c]); // the name, as a pointer to the question
        out.extend_from_slice(&1u16.to_be_bytes()); // TYPE A
        out.extend_from_slice(&1u16.to_be_bytes()); // CLASS IN
        out.extend_from_slice(&60u32.to_be_bytes()); // TTL
        out.extend_from_slice(&4u16.to_be_bytes()); // RDLENGTH
        out.extend_from_slice(&[127, 0, 0, 1]);
    }
    Some(out)
}
