//! The client against a scripted fake of the libpod service: version checks
//! at connect time, Podman 5 replies with fields 4.3 never sent, error bodies.
//! These need no podman and always run.

use std::path::PathBuf;
use std::sync::Arc;

use gpuq_podman::{Error, LibpodClient, Podman};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixListener;

/// A canned reply: status line, extra headers, body.
#[derive(Clone)]
struct Canned {
    status: &'static str,
    headers: Vec<(&'static str, String)>,
    body: String,
}

/// Serves `routes` (first whose path prefix matches the request target) on a
/// socket in a temp dir, for as long as the returned guard lives.
struct Fake {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn ping(version: &str) -> Canned {
    let mut headers = vec![("Api-Version", "1.41".to_owned())];
    if !version.is_empty() {
        headers.push(("Libpod-Api-Version", version.to_owned()));
    }
    Canned {
        status: "200 OK",
        headers,
        body: "OK".into(),
    }
}

fn fake(routes: Vec<(&'static str, Canned)>) -> Fake {
    let dir = tempfile::tempdir().expect("temp dir");
    let socket = dir.path().join("fake.sock");
    let listener = UnixListener::bind(&socket).expect("bind fake socket");
    let routes = Arc::new(routes);
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            let routes = routes.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&buf).into_owned();
                let target = head.split(' ').nth(1).unwrap_or("").to_owned();
                let reply = routes
                    .iter()
                    .find(|(prefix, _)| target.starts_with(prefix))
                    .map(|(_, c)| c.clone())
                    .unwrap_or(Canned {
                        status: "404 Not Found",
                        headers: vec![],
                        body: format!(
                            r#"{{"cause":"no route","message":"fake has no route for {target}","response":404}}"#
                        ),
                    });
                let mut out = format!("HTTP/1.1 {}\r\n", reply.status);
                for (k, v) in &reply.headers {
                    out.push_str(&format!("{k}: {v}\r\n"));
                }
                out.push_str(&format!(
                    "Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
                    reply.body.len(),
                    reply.body
                ));
                let _ = conn.write_all(out.as_bytes()).await;
                let _ = conn.shutdown().await;
            });
        }
    });
    Fake {
        _dir: dir,
        socket,
        task,
    }
}

#[tokio::test]
async fn connect_refuses_a_podman_older_than_4_3() {
    let f = fake(vec![("/v4.0.0/libpod/_ping", ping("4.2.1"))]);
    let err = LibpodClient::connect(&f.socket).await.unwrap_err();
    assert!(matches!(err, Error::UnsupportedVersion { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("\"4.2.1\""), "{msg}");
    assert!(msg.contains("4.3.0 or newer"), "{msg}");
    assert!(msg.contains(&f.socket.display().to_string()), "{msg}");
}

#[tokio::test]
async fn connect_refuses_a_socket_that_is_not_libpod() {
    // A Docker daemon answers _ping without the Libpod-API-Version header.
    let f = fake(vec![("/v4.0.0/libpod/_ping", ping(""))]);
    let err = LibpodClient::connect(&f.socket).await.unwrap_err();
    assert!(matches!(err, Error::NotLibpod { .. }), "{err}");
}

#[tokio::test]
async fn connect_to_a_missing_socket_names_the_path() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("absent.sock");
    let err = LibpodClient::connect(&path).await.unwrap_err();
    assert!(matches!(err, Error::Connect { .. }), "{err}");
    assert!(err.to_string().contains("absent.sock"), "{err}");
}

#[tokio::test]
async fn podman_5_replies_with_unknown_fields_are_read_leniently() {
    // Shapes as Podman 5.x sends them: more fields, some null.
    let inspect = r#"{"Id":"c0ffee","Created":"2026-01-01T00:00:00Z","Path":"sh","Args":[],
        "State":{"OciVersion":"1.2.0","Status":"running","Running":true,"Paused":false,
        "Restarting":false,"OOMKilled":false,"Dead":false,"Pid":4242,"ConmonPid":4240,
        "ExitCode":0,"Error":"","StartedAt":"2026-01-01T00:00:01Z","FinishedAt":"0001-01-01T00:00:00Z",
        "CgroupPath":"/libpod_parent/x","CheckpointedAt":"0001-01-01T00:00:00Z"},
        "Image":"38b4c682e41264e6e2287510812230abf348497f96d258098e120687873ab5d7",
        "ImageDigest":"sha256:aa","ImageName":"localhost/x:latest","Name":"srv",
        "Config":{"Hostname":"h","Labels":{"io.gpuq.lease":"L9","io.gpuq.role":"server"},
        "StopSignal":"SIGTERM","HealthcheckOnFailureAction":"none"},"HostConfig":{},
        "UseImageHosts":false,"KubeExitCodePropagation":"invalid"}"#;
    let list = r#"[{"AutoRemove":false,"Command":null,"Created":"2026-01-01T00:00:00Z",
        "Exited":false,"ExitCode":0,"Id":"c0ffee","Image":"localhost/x:latest",
        "ImageID":"38b4c682e41264e6e2287510812230abf348497f96d258098e120687873ab5d7",
        "IsInfra":false,"Labels":{"io.gpuq.lease":"L9","io.gpuq.role":"server"},
        "Mounts":[],"Names":["srv"],"Namespaces":{},"Networks":[],"Pid":4242,"Pod":"",
        "PodName":"","Ports":null,"Restarts":0,"Size":null,"StartedAt":1,"State":"running",
        "Status":"Up 1 second","CIDFile":""}]"#;
    let f = fake(vec![
        ("/v4.0.0/libpod/_ping", ping("5.4.2")),
        (
            "/v4.0.0/libpod/containers/srv/json",
            Canned {
                status: "200 OK",
                headers: vec![],
                body: inspect.into(),
            },
        ),
        (
            "/v4.0.0/libpod/containers/json",
            Canned {
                status: "200 OK",
                headers: vec![],
                body: list.into(),
            },
        ),
    ]);
    let client = LibpodClient::connect(&f.socket)
        .await
        .expect("5.x accepted");
    assert_eq!(client.version().major, 5);
    let info = client.container_inspect("srv").await.expect("inspect");
    assert_eq!(info.state.pid, 4242);
    assert!(info.state.running);
    assert_eq!(info.labels["io.gpuq.lease"], "L9");
    let list = client
        .container_list(&gpuq_podman::LabelFilter::lease("L9"))
        .await
        .expect("list");
    assert_eq!(list[0].role(), Some(gpuq_podman::Role::Server));
}

#[tokio::test]
async fn podman_error_bodies_are_carried_in_the_error() {
    let f = fake(vec![
        ("/v4.0.0/libpod/_ping", ping("4.3.1")),
        (
            "/v4.0.0/libpod/containers/srv/start",
            Canned {
                status: "500 Internal Server Error",
                headers: vec![],
                body: r#"{"cause":"runc failed","message":"runc create failed: no cgroup mount found in mountinfo","response":500}"#.into(),
            },
        ),
    ]);
    let client = LibpodClient::connect(&f.socket).await.expect("connect");
    let err = client.container_start("srv").await.unwrap_err();
    match &err {
        Error::Api {
            status,
            message,
            target,
            ..
        } => {
            assert_eq!(*status, 500);
            assert_eq!(target, "srv");
            assert!(message.contains("no cgroup mount"), "{message}");
        }
        other => panic!("expected an API error, got {other}"),
    }
    assert!(err.to_string().contains("container start srv"), "{err}");
    let err = client.container_inspect("nope").await.unwrap_err();
    assert!(err.is_not_found(), "{err}");
}

/// The node daemon will be generic over `P: Podman` and call it from spawned
/// tasks: the trait's futures must be `Send` through a generic bound.
async fn list_in_a_spawned_task<P: Podman + 'static>(podman: Arc<P>) -> gpuq_podman::Result<usize> {
    tokio::spawn(async move {
        podman
            .container_list(&gpuq_podman::LabelFilter::ours())
            .await
            .map(|l| l.len())
    })
    .await
    .expect("task")
}

#[tokio::test]
async fn the_trait_is_usable_generically_from_spawned_tasks() {
    let f = fake(vec![
        ("/v4.0.0/libpod/_ping", ping("4.9.4-rhel")),
        (
            "/v4.0.0/libpod/containers/json",
            Canned {
                status: "200 OK",
                headers: vec![],
                body: "[]".into(),
            },
        ),
    ]);
    let client = LibpodClient::connect(&f.socket)
        .await
        .expect("4.9 accepted");
    assert_eq!(
        list_in_a_spawned_task(Arc::new(client))
            .await
            .expect("list"),
        0
    );
}
