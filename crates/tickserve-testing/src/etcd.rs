//! An etcd server (Debian's `etcd-server`) on loopback for a test: one
//! member, or a cluster of three, each on free ports with a temporary data
//! directory; stopped (killed) when dropped.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One etcd member.
#[derive(Debug)]
pub struct Member {
    /// Its name in the cluster.
    pub name: String,
    /// Its client URL (`http://127.0.0.1:PORT`).
    pub client: String,
    peer: String,
    dir: PathBuf,
    child: Option<Child>,
}

/// An etcd cluster started for a test.
#[derive(Debug)]
pub struct Etcd {
    /// Its members.
    pub members: Vec<Member>,
    _dir: tempdir::Dir,
}

mod tempdir {
    /// A directory removed when dropped.
    #[derive(Debug)]
    pub struct Dir(pub std::path::PathBuf);

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

impl Etcd {
    /// One member.
    pub fn start() -> Etcd {
        Etcd::cluster(1)
    }

    /// `size` members in one cluster; returns once every member answers.
    pub fn cluster(size: usize) -> Etcd {
        let dir = std::env::temp_dir().join(format!(
            "tickserve-etcd-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).expect("a data directory for etcd");
        let mut members: Vec<Member> = (0..size)
            .map(|i| Member {
                name: format!("m{i}"),
                client: format!("http://127.0.0.1:{}", free_port()),
                peer: format!("http://127.0.0.1:{}", free_port()),
                dir: dir.join(format!("m{i}")),
                child: None,
            })
            .collect();
        let initial: Vec<String> = members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer))
            .collect();
        let initial = initial.join(",");
        for member in &mut members {
            member.spawn(&initial, "new");
        }
        let etcd = Etcd {
            members,
            _dir: tempdir::Dir(dir),
        };
        etcd.wait_healthy();
        etcd
    }

    /// The client URLs of every member.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.client.clone()).collect()
    }

    /// Waits until `etcdctl endpoint health` says every running member is healthy.
    #[allow(clippy::disallowed_methods)] // waits for another process (etcd) in real time
    pub fn wait_healthy(&self) {
        let started = Instant::now();
        let running: Vec<String> = self
            .members
            .iter()
            .filter(|m| m.child.is_some())
            .map(|m| m.client.clone())
            .collect();
        loop {
            let healthy = Command::new("etcdctl")
                .env("ETCDCTL_API", "3")
                .args(["--endpoints", &running.join(","), "endpoint", "health"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if healthy {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "etcd did not become healthy in 30 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills member `i` (`kill -9`).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts member `i` again on its data directory.
    pub fn restart(&mut self, i: usize) {
        let initial: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer))
            .collect();
        self.members[i].spawn(&initial.join(","), "existing");
    }

    /// Runs `etcdctl ARGS` against the running members; its output. Panics
    /// when it fails.
    pub fn ctl(&self, args: &[&str]) -> String {
        let running: Vec<&str> = self
            .members
            .iter()
            .filter(|m| m.child.is_some())
            .map(|m| m.client.as_str())
            .collect();
        let output = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &running.join(",")])
            .args(args)
            .output()
            .expect("etcdctl runs");
        assert!(
            output.status.success(),
            "etcdctl {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// The index of the member that leads now, if one does.
    pub fn leader(&self) -> Option<usize> {
        self.members.iter().position(|m| {
            m.child.is_some()
                && Command::new("etcdctl")
                    .env("ETCDCTL_API", "3")
                    .args(["--endpoints", &m.client, "endpoint", "status"])
                    .output()
                    .ok()
                    .and_then(|o| String::from_utf8(o.stdout).ok())
                    // endpoint, id, version, db size, is leader, ...
                    .and_then(|text| text.split(", ").nth(4).map(|s| s.trim() == "true"))
                    .unwrap_or(false)
        })
    }
}

impl Member {
    fn spawn(&mut self, initial: &str, state: &str) {
        let child = Command::new("etcd")
            .args([
                "--name",
                &self.name,
                "--data-dir",
                &self.dir.to_string_lossy(),
                "--listen-client-urls",
                &self.client,
                "--advertise-client-urls",
                &self.client,
                "--listen-peer-urls",
                &self.peer,
                "--initial-advertise-peer-urls",
                &self.peer,
                "--initial-cluster",
                initial,
                "--initial-cluster-state",
                state,
                "--heartbeat-interval",
                "50",
                "--election-timeout",
                "500",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcd (Debian's etcd-server: scripts/apt_install.sh etcd etcd-server)");
        self.child = Some(child);
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}
