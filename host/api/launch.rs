//! Whether the launcher that started this process connected it to the other tasks it started:
//! a task alone in its MPI world although its launcher started several is refused by
//! [`crate::init`] ([`Error::UnwiredLaunch`]; `docs/cluster.md`, "Slurm").

use crate::api::error::Error;

/// A launcher's count of the tasks it started together, and what to do when MPI did not join
/// them.
struct Size {
    variable: &'static str,
    launcher: &'static str,
    hint: &'static str,
}

/// The task counts, in the order they are trusted: an MPI launcher's own (the size of the very
/// job this process belongs to: a nested `mpirun -np 1` inside a larger step says 1), then the
/// resource manager's step.
const SIZES: [Size; 4] = [
    Size {
        variable: "OMPI_COMM_WORLD_SIZE",
        launcher: "Open MPI's mpirun",
        hint: "Launch it with the mpirun of the MPI library it is linked with",
    },
    Size {
        variable: "PMI_SIZE",
        launcher: "the launcher",
        hint: "Launch it with the mpiexec of the MPI library it is linked with, or give srun the PMI that library \
               takes (--mpi=pmix or --mpi=pmi2)",
    },
    Size {
        variable: "SLURM_STEP_NUM_TASKS",
        launcher: "srun",
        hint: "Pass srun --mpi=pmix (Open MPI, or an MPI built with PMIx) or --mpi=pmi2 (MPICH, MVAPICH2, Intel MPI)",
    },
    Size {
        variable: "FLUX_JOB_SIZE",
        launcher: "flux run",
        hint: "Pass flux run -o pmi=pmix or -o pmi=simple, whichever the MPI library takes",
    },
];

/// The processes that start a launcher's tasks. A task is checked only when one of them is its
/// parent: a program started by hand from the shell of an interactive step (`srun --pty bash`
/// inherits the step's task count) runs alone on purpose.
const STARTERS: [&str; 9] =
    ["slurmstepd", "flux-shell", "hydra_pmi_proxy", "orted", "prted", "prterun", "orterun", "mpirun", "mpiexec"];

/// What this process's launch says, read before `MPI_Init` (a singleton Open MPI sets its own
/// launch variables).
#[derive(Debug)]
pub(crate) struct Launch {
    /// The first task count of [`SIZES`] that is set: its index and value.
    size: Option<(usize, String)>,
    /// The parent process's name (`/proc/PID/comm`).
    parent: Option<String>,
}

impl Launch {
    pub(crate) fn capture() -> Launch {
        let parent = std::fs::read_to_string(format!("/proc/{}/comm", std::os::unix::process::parent_id()))
            .ok()
            .map(|n| n.trim().to_string());
        Launch::from(|v| std::env::var(v).ok(), parent)
    }

    /// The launch that the variables `var` reads and the parent process's name describe.
    fn from(var: impl Fn(&str) -> Option<String>, parent: Option<String>) -> Launch {
        let size = SIZES.iter().enumerate().find_map(|(i, s)| Some((i, var(s.variable)?)));
        Launch { size, parent }
    }

    /// The error of a task in an MPI world of `world_size` ranks, if its launcher started it
    /// with others it was not joined to.
    pub(crate) fn unwired(&self, world_size: usize) -> Option<Error> {
        let started_by_launcher = self.parent.as_deref().is_some_and(|p| STARTERS.contains(&p));
        if world_size != 1 || !started_by_launcher {
            return None;
        }
        let (i, value) = self.size.as_ref()?;
        let tasks = value.trim().parse::<usize>().ok().filter(|&t| t > 1)?;
        let s = &SIZES[*i];
        Some(Error::UnwiredLaunch { launcher: s.launcher, tasks, variable: s.variable, hint: s.hint })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch(vars: &[(&str, &str)], parent: &str) -> Launch {
        let var = |name: &str| vars.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string());
        Launch::from(var, Some(parent.into()))
    }

    #[test]
    fn unwired_steps_and_mismatched_launchers_are_refused() {
        // srun --mpi=none (or a PMIx the MPI library lacks: PMIX_RANK alone says nothing).
        let e = launch(&[("SLURM_STEP_NUM_TASKS", "4"), ("PMIX_RANK", "2")], "slurmstepd").unwired(1);
        assert!(matches!(e, Some(Error::UnwiredLaunch { launcher: "srun", tasks: 4, .. })), "{e:?}");
        let text = e.map(|e| e.to_string()).unwrap_or_default();
        assert!(text.contains("--mpi=pmix") && text.contains("4 separate"), "{text}");
        // A PMI-2 step, or another MPI's mpiexec, or Flux's simple PMI: the PMI's size counts.
        let e = launch(&[("PMI_SIZE", "2"), ("SLURM_STEP_NUM_TASKS", "2")], "hydra_pmi_proxy").unwired(1);
        assert!(matches!(e, Some(Error::UnwiredLaunch { variable: "PMI_SIZE", tasks: 2, .. })), "{e:?}");
        let e = launch(&[("FLUX_JOB_SIZE", "3")], "flux-shell").unwired(1);
        assert!(matches!(e, Some(Error::UnwiredLaunch { launcher: "flux run", tasks: 3, .. })), "{e:?}");
        let e = launch(&[("OMPI_COMM_WORLD_SIZE", "2")], "mpirun").unwired(1);
        assert!(matches!(e, Some(Error::UnwiredLaunch { variable: "OMPI_COMM_WORLD_SIZE", .. })), "{e:?}");
    }

    #[test]
    fn joined_lone_and_hand_started_tasks_pass() {
        // Joined: the world has the tasks.
        assert!(launch(&[("SLURM_STEP_NUM_TASKS", "4")], "slurmstepd").unwired(4).is_none());
        // mpirun -np 1 inside a step of 2 (its own count is trusted first).
        assert!(launch(&[("OMPI_COMM_WORLD_SIZE", "1"), ("SLURM_STEP_NUM_TASKS", "2")], "orted").unwired(1).is_none());
        // One task; a batch script (no step); an unreadable count; nothing set.
        assert!(launch(&[("SLURM_STEP_NUM_TASKS", "1")], "slurmstepd").unwired(1).is_none());
        assert!(launch(&[("SLURM_NTASKS", "4")], "slurmstepd").unwired(1).is_none());
        assert!(launch(&[("SLURM_STEP_NUM_TASKS", "x")], "slurmstepd").unwired(1).is_none());
        assert!(launch(&[], "slurmstepd").unwired(1).is_none());
        // Started by hand from an interactive step's shell.
        assert!(launch(&[("SLURM_STEP_NUM_TASKS", "4")], "bash").unwired(1).is_none());
    }
}
