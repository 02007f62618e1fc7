/* Values MPI defines as C macros, which bindgen cannot see. Compiled with the MPI compiler
 * wrapper so they are right for whichever MPI implementation the crate links against. */
#include <mpi.h>

void *duralumin_mpi_in_place(void) { return MPI_IN_PLACE; }

/* MPI_COMM_WORLD's error handler under duralumin::init. Open MPI 4.1 raises the error of a
 * failed non-blocking collective (a message truncated by another rank's count) on
 * MPI_COMM_WORLD's handler rather than on the request's communicator, whose handler Duralumin
 * set to MPI_ERRORS_RETURN. While a thread completes one of Duralumin's requests the error
 * is returned to it (a typed error, a report); anywhere else the handler is
 * MPI_ERRORS_ARE_FATAL's: print and abort the job. */
#include <stdio.h>

static _Thread_local int duralumin_completing;

void duralumin_completing_requests(int on) { duralumin_completing = on; }

static void duralumin_world_errhandler(MPI_Comm *comm, int *code, ...) {
    if (duralumin_completing) {
        return;
    }
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(*code, text, &len);
    fprintf(stderr, "MPI error on MPI_COMM_WORLD: %.*s (MPI_ERRORS_ARE_FATAL), aborting the job\n", len, text);
    fflush(stderr);
    MPI_Abort(*comm, *code);
}

int duralumin_set_world_errhandler(void) {
    MPI_Errhandler handler;
    int rc = MPI_Comm_create_errhandler(duralumin_world_errhandler, &handler);
    if (rc != MPI_SUCCESS) {
        return rc;
    }
    rc = MPI_Comm_set_errhandler(MPI_COMM_WORLD, handler);
    MPI_Errhandler_free(&handler);
    return rc;
}
