/* Values MPI defines as C macros, which bindgen cannot see. Compiled with the MPI compiler
 * wrapper so they are right for whichever MPI implementation the crate links against. */
#include <mpi.h>

void *duralumin_mpi_in_place(void) { return MPI_IN_PLACE; }
