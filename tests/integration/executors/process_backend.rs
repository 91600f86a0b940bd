//! The process backend: a catalog given by a bare file name, descendants that leave the process
//! group and session, oversized output, and configuration mistakes that no retry can fix.

use std::{path::Path, process::Command, time::Duration};

use toolgate::proto::{ToolStatus, tool_gate_client::ToolGateClient};

use crate::{
    executors::{env_with_path, process_catalog, process_tool},
    support::binary::spawn_in,
    support::python,
    support::{TestServer, call, exec, who},
};

#[tokio::test]
async fn a_catalog_given_by_a_bare_file_name_runs_process_tools_in_its_directory() {
    let dir = tempfile::tempdir().unwrap();
    let tools = process_tool("cwd", "import os; print(os.getcwd(), end='')", "");
    std::fs::write(dir.path().join("catalog.yaml"), process_catalog(&tools)).unwrap();
    let path = std::env::var("PATH").unwrap_or_default();
    // Started inside the directory with `--config catalog.yaml`: the catalog's directory is "".
    let spawned = spawn_in(
        dir.path(),
        &["--config", "catalog.yaml"],
        &[("PATH", &path)],
    );
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", spawned.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = ToolGateClient::new(channel);
    let r = exec(&mut client, &who("acme"), call("cwd", "{}")).await;
    assert_eq!(r.status(), ToolStatus::Ok, "{r:?}");
    assert_eq!(
        Path::new(&r.model_text),
        dir.path().canonicalize().unwrap(),
        "the program runs in the catalog's directory"
    );
    crate::support::binary::stop(spawned).await;
}

/// Whether a process is gone entirely: exited and reaped (a zombie still holds its pid).
fn reaped(pid: i32) -> bool {
    !Path::new(&format!("/proc/{pid}")).exists()
}

/// Waits (bounded) until every pid is gone and reaped.
async fn wait_reaped(pids: &[i32]) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !pids.iter().all(|&p| reaped(p)) {
        let alive: Vec<_> = pids.iter().filter(|&&p| !reaped(p)).collect();
        assert!(
            tokio::time::Instant::now() < deadline,
            "still present in /proc after 10s: {alive:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A script that starts a grandchild in a session of its own (fork, setsid, fork: the way daemons
/// detach), optionally with a cleared environment, writes its pids to `pids` and then `rest`.
fn detaching_script(pids: &Path, clear_env: bool, rest: &str) -> String {
    format!(
        r#"import os, sys, time
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.close(r)
        os.write(w, str(os.getpid()).encode())
        os.close(w)
        for fd in (0, 1, 2):
            os.close(fd)
        if {clear_env}:
            os.execve("/bin/sleep", ["sleep", "30"], {{}})
        time.sleep(30)
    os._exit(0)
os.close(w)
grandchild = int(os.read(r, 32))
open({pids:?}, "w").write(f"{{os.getpid()}} {{grandchild}}")
{rest}
"#,
        clear_env = if clear_env { "True" } else { "False" },
        pids = pids.display().to_string(),
    )
}

fn read_pids(path: &Path) -> Vec<i32> {
    std::fs::read_to_string(path)
        .expect("the script wrote its pids")
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect()
}

#[tokio::test]
async fn descendants_that_leave_the_session_are_killed_and_reaped() {
    let dir = tempfile::tempdir().unwrap();
    let [exits, hangs, hangs_clean] = ["exits", "hangs", "hangs_clean"].map(|n| dir.path().join(n));
    let tools = process_tool(
        "exits",
        &detaching_script(&exits, false, "print('done', end='')"),
        "",
    ) + &process_tool(
        "hangs",
        &detaching_script(&hangs, false, "time.sleep(30)"),
        "",
    )
    .replace("timeout: 2s", "timeout: 1s")
        + &process_tool(
            "hangs_clean",
            &detaching_script(&hangs_clean, true, "time.sleep(30)"),
            "",
        )
        .replace("timeout: 2s", "timeout: 1s");
    let server = TestServer::start_with_env(&process_catalog(&tools), &env_with_path()).await;
    let mut client = server.client().await;

    // The program finishes normally, leaving the detached grandchild behind.
    let r = exec(&mut client, &who("acme"), call("exits", "{}")).await;
    assert_eq!(
        (r.status(), r.model_text.as_str()),
        (ToolStatus::Ok, "done"),
        "{r:?}"
    );
    wait_reaped(&read_pids(&exits)).await;

    // The program is still running at the timeout; its grandchild left the session, and in the
    // second case cleared its whole environment too.
    for (tool, pids) in [("hangs", &hangs), ("hangs_clean", &hangs_clean)] {
        let r = exec(&mut client, &who("acme"), call(tool, "{}")).await;
        assert_eq!(r.status(), ToolStatus::Timeout, "{tool}: {r:?}");
        wait_reaped(&read_pids(pids)).await;
    }
    server.stop().await;
}

#[tokio::test]
async fn output_over_the_limit_is_output_too_large_promptly() {
    // The program would write 50 MiB (far more than a pipe holds), noting each 64 KiB chunk the
    // pipe took and, at the end, that it finished. Cut off promptly, it is killed after the first
    // chunk or few: the pipe holds 64 KiB and toolgate reads past its 1,000-byte limit at once. A
    // sidecar that read on (or waited for the end) would let it finish.
    let dir = tempfile::tempdir().unwrap();
    let progress = dir.path().join("progress");
    let script = format!(
        "import os\n\
         p = {path:?}\n\
         open(p, 'w').write(str(os.getpid()) + '\\n')\n\
         chunk = b'y' * 65536\n\
         for _ in range(800):\n\
         \x20   os.write(1, chunk)\n\
         \x20   open(p, 'a').write('.')\n\
         open(p, 'a').write('finished')\n",
        path = progress.display().to_string()
    );
    let tools = process_tool("flood", &script, "    max_output_bytes: 1000\n")
        .replace("timeout: 2s", "timeout: 60s");
    let server = TestServer::start_with_env(&process_catalog(&tools), &env_with_path()).await;
    let mut client = server.client().await;
    let r = exec(&mut client, &who("acme"), call("flood", "{}")).await;
    assert_eq!(
        (
            r.status(),
            r.error_type.as_str(),
            r.retryable,
            r.refused_by.as_str()
        ),
        (ToolStatus::Error, "output_too_large", false, "result"),
        "{r:?}"
    );
    // Once the program is gone, what it wrote is final.
    let written = std::fs::read_to_string(&progress).unwrap();
    let pid: i32 = written.lines().next().unwrap().parse().unwrap();
    wait_reaped(&[pid]).await;
    let written = std::fs::read_to_string(&progress).unwrap();
    let chunks = written.matches('.').count();
    assert!(
        !written.ends_with("finished"),
        "the program wrote all {chunks} chunks: its output was read to the end"
    );
    assert!(
        chunks < 16,
        "the program wrote {chunks} chunks of 64 KiB before it was stopped"
    );
    server.stop().await;
}

/// A process tool running `command` with `extra` lines under `process:`.
fn misconfigured_tool(name: &str, command: &str, extra: &str) -> String {
    format!(
        "  - name: {name}\n    description: d\n    risk_level: read_only\n    input_schema: {{ type: object }}\n    executor:\n      process:\n        command: {command}\n        env: [PATH]\n{extra}"
    )
}

#[tokio::test]
async fn configuration_mistakes_are_not_retryable_and_say_what_to_fix() {
    let dir = tempfile::tempdir().unwrap();
    let not_executable = dir.path().join("script.txt");
    std::fs::write(&not_executable, "print('hi')").unwrap();
    let tools = misconfigured_tool("missing", "/nonexistent/toolgate-test-program", "")
        + &misconfigured_tool("not_executable", &not_executable.display().to_string(), "")
        + &misconfigured_tool(
            "bad_dir",
            &python(),
            "        working_dir: /nonexistent/toolgate-test-dir\n",
        );
    let server = TestServer::start_with_env(&process_catalog(&tools), &env_with_path()).await;
    let mut client = server.client().await;
    for (tool, what) in [
        ("missing", "program"),
        ("not_executable", "program"),
        ("bad_dir", "working directory"),
    ] {
        let r = exec(&mut client, &who("acme"), call(tool, "{}")).await;
        assert_eq!(
            (r.status(), r.error_type.as_str(), r.retryable),
            (ToolStatus::Error, "backend_misconfigured", false),
            "{tool}: {r:?}"
        );
        assert!(
            r.error_message.contains(what),
            "{tool}: {}",
            r.error_message
        );
        // The model is told what is wrong, not where things live on the sidecar's machine.
        assert!(
            !r.error_message.contains("/nonexistent"),
            "{tool}: {}",
            r.error_message
        );
    }
    server.stop().await;
}

#[test]
fn check_reports_programs_that_cannot_run_here_unless_told_the_host_differs() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = dir.path().join("catalog.yaml");
    let tools = misconfigured_tool("missing", "/nonexistent/toolgate-test-program", "")
        + &misconfigured_tool(
            "bad_dir",
            "/bin/sh",
            "        working_dir: /nonexistent/toolgate-test-dir\n",
        );
    let servers = "mcp_servers:\n  local:\n    command: [\"/nonexistent/toolgate-test-mcp\"]\n    tools: { ping: { risk_level: read_only } }\n";
    std::fs::write(
        &catalog,
        process_catalog(&tools).replace("tools:\n", &format!("{servers}tools:\n")),
    )
    .unwrap();
    let check = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_toolgate"))
            .args(["check", "--config", catalog.to_str().unwrap()])
            .args(extra)
            .output()
            .unwrap()
    };
    let here = check(&[]);
    let stderr = String::from_utf8_lossy(&here.stderr);
    assert_eq!(here.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("tools[0].executor.process.command")
            && stderr.contains("/nonexistent/toolgate-test-program"),
        "{stderr}"
    );
    assert!(
        stderr.contains("tools[1].executor.process.working_dir"),
        "{stderr}"
    );
    assert!(stderr.contains("mcp_servers.local.command"), "{stderr}");
    // Checked on another machine (CI) than the one that serves it: only the portable checks.
    let elsewhere = check(&["--portable"]);
    assert_eq!(
        elsewhere.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&elsewhere.stderr)
    );
}
