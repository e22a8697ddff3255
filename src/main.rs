//! The `zonegate` command line: parses arguments and calls the library.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use zonegate::cli::entry;
use zonegate::telemetry::{self, LogFormat};

#[derive(Parser)]
#[command(
    name = "zonegate",
    version,
    about = "Multi-zone, active-active AI inference gateway"
)]
struct Cli {
    /// Log format on stderr (text has colour only on a terminal, never
    /// with NO_COLOR set).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Exit when standard input closes: a parent (the demo, a test) that
    /// dies, even by SIGKILL, takes this process with it.
    #[arg(long, global = true, hide = true)]
    exit_with_parent: bool,
    #[command(subcommand)]
    command: Command,
}

/// `ctl --help`'s tail: what the exit codes mean, and a first command.
const CTL_AFTER_HELP: &str = "Exit codes: 0 done; 1 refused (a safety rule, or nothing was written, e.g. \
no leader); 2 bad usage, or nothing was sent (unreachable); 3 outcome unknown: the write may have \
committed, check `zonegate ctl decisions`; 4 admin token missing or rejected.

Examples:
  zonegate ctl --admin http://127.0.0.1:9090 --token \"$TOKEN\" status
  zonegate ctl failover --from az-b --dry-run --admin https://gw-a.internal:9090
  export ZONEGATE_ADMIN=http://127.0.0.1:9090 ZONEGATE_ADMIN_TOKEN=...   # then: zonegate ctl status";

#[derive(Subcommand)]
enum Command {
    /// Run one gateway node.
    Serve {
        /// The node's TOML config file.
        #[arg(long)]
        config: PathBuf,
        /// This node lost its data_dir: catch up as a learner, then be
        /// promoted by the leader to its configured role.
        #[arg(long)]
        rejoin: bool,
    },
    /// Validate a config file and exit.
    CheckConfig {
        /// The TOML config file to check.
        file: PathBuf,
    },
    /// A local cluster with mock backends on loopback; Ctrl-C stops it.
    Demo {
        /// Where the az-a node listens for inference requests.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: String,
        /// Where the az-a node serves its admin API and dashboard.
        #[arg(long, default_value = "127.0.0.1:9090")]
        admin_listen: String,
    },
    /// Operate a cluster through its admin API.
    #[command(after_help = CTL_AFTER_HELP)]
    Ctl {
        /// Admin URL of any node, e.g. http://127.0.0.1:9090 (required;
        /// before or after the verb).
        #[arg(long, global = true, env = "ZONEGATE_ADMIN")]
        admin: Option<String>,
        /// Admin bearer token.
        #[arg(
            long,
            global = true,
            env = "ZONEGATE_ADMIN_TOKEN",
            hide_env_values = true
        )]
        token: Option<String>,
        /// Print the admin API's JSON (raw values, times in epoch ms)
        /// instead of tables; accepted before or after the verb.
        #[arg(long, global = true)]
        json: bool,
        #[command(subcommand)]
        verb: zonegate::cli::ctl::Verb,
    },
    /// Print a shell completion script, e.g.
    /// `zonegate completions bash > /etc/bash_completion.d/zonegate`.
    Completions {
        /// The shell to complete for.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff), e.g. `zonegate man | man -l -`.
    Man,
    /// An OpenAI-compatible fake inference server with injectable faults.
    MockBackend {
        /// Address to listen on, e.g. 127.0.0.1:0.
        #[arg(long)]
        listen: SocketAddr,
        /// Name reported in stats and responses (default: the address).
        #[arg(long)]
        name: Option<String>,
        /// Zone reported in stats and responses.
        #[arg(long)]
        zone: Option<String>,
        /// A model it serves (repeatable); none means any name.
        #[arg(long = "model")]
        models: Vec<String>,
        /// The provider whose wire format it speaks: paths, credential
        /// header, error bodies, rate-limit headers and stream events.
        #[arg(long, value_enum, default_value = "openai")]
        provider: zonegate::config::Provider,
        /// The credential it expects in that provider's header
        /// (`Authorization: Bearer`, `api-key`, `x-api-key`); anything
        /// else gets the provider's 401.
        #[arg(long)]
        expect_key: Option<String>,
        /// At most N requests generate (`generation_ms`) at once; the
        /// rest wait their turn, as a server's batch does.
        #[arg(long, value_name = "N")]
        capacity: Option<u32>,
    },
    /// Run a fault-injection drill from a scenario (chaos/scenarios/*.toml);
    /// exits 0 PASS, 1 FAIL, 2 could not run.
    Drill {
        /// The scenario file, e.g. chaos/scenarios/zone-blackout.toml.
        file: PathBuf,
        /// Folder for report.md, report.html and report.json
        /// (default: drill-reports/<scenario name>).
        #[arg(long)]
        report: Option<PathBuf>,
        /// Print the plan and exit.
        #[arg(long)]
        dry_run: bool,
        /// Override a scenario key, e.g. `--set load.duration=10s` (repeatable).
        #[arg(long = "set", value_name = "KEY=VALUE")]
        overrides: Vec<String>,
    },
}

fn main() -> ExitCode {
    let (args, warning) =
        zonegate::cli::members::legacy_member_admin(std::env::args_os().collect());
    if let Some(w) = warning {
        eprintln!("zonegate: {w}");
    }
    let cli = Cli::parse_from(args);
    // Generated from the CLI definition, before any runtime or logging.
    match cli.command {
        Command::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut cmd, "zonegate", &mut std::io::stdout());
            return ExitCode::SUCCESS;
        }
        Command::Man => {
            let cmd = <Cli as clap::CommandFactory>::command();
            return match clap_mangen::Man::new(cmd).render(&mut std::io::stdout()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("zonegate: cannot write the man page: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        _ => {}
    }
    telemetry::init_tracing(cli.log_format);
    if cli.exit_with_parent {
        zonegate::node::lifecycle::exit_when_stdin_closes();
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("zonegate: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Command::Drill {
        file,
        report,
        dry_run,
        overrides,
    } = cli.command
    {
        let exe = match std::env::current_exe() {
            Ok(exe) => exe,
            Err(e) => {
                eprintln!("zonegate drill: cannot find this binary: {e}");
                return ExitCode::from(zonegate_chaos::exit::NOT_RUN);
            }
        };
        return ExitCode::from(runtime.block_on(zonegate::cli::entry::drill(
            zonegate_chaos::Options {
                file,
                report_dir: report,
                dry_run,
                overrides,
                exe,
            },
        )));
    }
    let result = runtime.block_on(async {
        match cli.command {
            Command::Serve { config, rejoin } => {
                let opts = zonegate::node::start::ServeOptions { rejoin };
                entry::serve(&config, opts).await
            }
            Command::CheckConfig { file } => zonegate::cli::check_config(&file),
            Command::Demo {
                listen,
                admin_listen,
            } => {
                entry::demo(zonegate::tools::demo::DemoOptions {
                    listen,
                    admin_listen,
                })
                .await
            }
            Command::Ctl {
                admin,
                token,
                json,
                verb,
            } => match admin {
                Some(admin) => entry::ctl(admin, token, json, verb).await,
                // Global arguments cannot be required in clap: checked here,
                // with clap's exit code for bad usage.
                None => Err(anyhow::Error::new(zonegate::cli::ctl::CtlFailure {
                    exit: zonegate::cli::ctl::EXIT_USAGE,
                    message: "ctl needs --admin URL (or ZONEGATE_ADMIN), e.g. --admin http://127.0.0.1:9090".into(),
                })),
            },
            Command::Completions { .. } | Command::Man => Ok(()),
            Command::MockBackend {
                listen,
                name,
                zone,
                models,
                provider,
                expect_key,
                capacity,
            } => {
                let name = name.unwrap_or_else(|| listen.to_string());
                entry::mock(zonegate::tools::mock::MockOptions {
                    listen,
                    name,
                    zone,
                    models,
                    provider,
                    expect_key,
                    capacity,
                })
                .await
            }
            Command::Drill { .. } => unreachable!("handled above"),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("zonegate: {e:#}");
            // 1 for every failure but `ctl`'s (2 usage/unreachable, 3
            // outcome unknown).
            ExitCode::from(zonegate::cli::ctl::exit_code(&e))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every flag and argument of every command says what it is for
    /// (`--help`, the completions and the man page all show it).
    fn ctl_verbs(cmd: &clap::Command, path: &str, out: &mut Vec<(String, clap::Command)>) {
        for sub in cmd.get_subcommands() {
            let path = format!("{path} {}", sub.get_name());
            out.push((path.clone(), sub.clone()));
            ctl_verbs(sub, &path, out);
        }
    }

    /// Every `ctl` verb shows an Examples section, and no help names a
    /// source file (help is for operators, not for the code's readers).
    #[test]
    fn every_ctl_verb_has_examples_and_no_help_names_a_source_file() {
        let mut cmd = <Cli as clap::CommandFactory>::command();
        cmd.build();
        let ctl = cmd.find_subcommand("ctl").unwrap().clone();
        let mut verbs = vec![("ctl".to_owned(), ctl.clone())];
        ctl_verbs(&ctl, "ctl", &mut verbs);
        for (path, mut verb) in verbs {
            if path.ends_with(" help") || path.contains(" help ") {
                continue;
            }
            let help = verb.render_long_help().to_string();
            assert!(
                help.contains("Examples:\n  zonegate ctl"),
                "`zonegate {path} --help` has no Examples section (add \
                 #[command(after_help = \"Examples:\\n  zonegate ctl ...\")]):\n{help}"
            );
            assert!(
                !help.contains("src/"),
                "{path}: a source path in help:\n{help}"
            );
            assert!(
                help.contains("--admin"),
                "{path}: --admin not in help:\n{help}"
            );
        }
    }

    /// `--admin` and `--token` go where hands put them: after the verb too.
    #[test]
    fn admin_and_token_are_accepted_after_the_verb() {
        for args in [
            &[
                "zonegate",
                "ctl",
                "status",
                "--admin",
                "http://n1:9090",
                "--token",
                "t",
            ][..],
            &[
                "zonegate",
                "ctl",
                "--admin",
                "http://n1:9090",
                "status",
                "--token",
                "t",
            ][..],
            &[
                "zonegate",
                "ctl",
                "members",
                "list",
                "--admin",
                "http://n1:9090",
                "--token",
                "t",
            ][..],
        ] {
            let cli = Cli::try_parse_from(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
            let Command::Ctl { admin, token, .. } = cli.command else {
                panic!("{args:?}: not ctl");
            };
            assert_eq!(admin.as_deref(), Some("http://n1:9090"), "{args:?}");
            assert_eq!(token.as_deref(), Some("t"), "{args:?}");
        }
        let args = [
            "zonegate", "ctl", "members", "add", "--id", "4", "--zone", "az-a",
        ];
        let args: Vec<&str> = args
            .into_iter()
            .chain([
                "--raft",
                "r:1",
                "--member-admin",
                "a:1",
                "--admin",
                "http://n1:9090",
            ])
            .collect();
        let cli = Cli::try_parse_from(args).unwrap();
        let Command::Ctl { admin, .. } = cli.command else {
            panic!("not ctl");
        };
        assert_eq!(admin.as_deref(), Some("http://n1:9090"));
    }

    #[test]
    fn every_argument_has_help() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for a in cmd.get_arguments() {
                let builtin = matches!(a.get_id().as_str(), "help" | "version");
                if !builtin && !a.is_hide_set() && a.get_help().is_none() {
                    missing.push(format!("{path} {}", a.get_id()));
                }
            }
            for sub in cmd.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(
            &<Cli as clap::CommandFactory>::command(),
            "zonegate",
            &mut missing,
        );
        assert!(missing.is_empty(), "arguments without help: {missing:?}");
    }
}
