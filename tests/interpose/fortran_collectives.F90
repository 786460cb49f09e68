! SPDX-License-Identifier: Apache-2.0
! An unmodified Fortran MPI program (`use mpi`, or `use mpi_f08` built with SQUALL_F08;
! gfortran) for libsquall_mpi.so's Fortran bindings (ctest collective.fortran_interposed.np*
! and collective.fortran_f08_interposed.np*): allreduce (out of place and in place,
! double sums and integer maxima), reduce_scatter_block, reduce_scatter (alike blocks),
! allgather (and in place), allgatherv (alike blocks, end to end and in reverse order), bcast
! from the last rank and barrier, and their non-blocking forms (seven in flight, completed by
! MPI_Wait, MPI_Test, MPI_Waitany and MPI_Waitall), each checked against the result computed
! here in full (small integers: exact in any order). Prints one line per check; stops with
! status 1 on a wrong one.
program fortran_collectives
#ifdef SQUALL_F08
  use mpi_f08
#else
  use mpi
#endif
  implicit none
  integer, parameter :: n = 30000
  integer :: ierr, rank, size, i, r
  double precision, allocatable :: a(:), b(:), want(:), gathered(:), block(:)
  integer, allocatable :: ia(:), ib(:), counts(:), displs(:)
  double precision, allocatable :: na(:), nb(:), nc(:), nd(:), ne(:), nf(:), ng(:)
  integer :: which, k
  logical :: flag
#ifdef SQUALL_F08
  type(MPI_Request) :: requests(7)
  type(MPI_Status) :: status
#else
  integer :: requests(7)
  integer :: status(MPI_STATUS_SIZE)
#endif

  call MPI_Init(ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call MPI_Comm_size(MPI_COMM_WORLD, size, ierr)
  allocate(a(n * size), b(n * size), want(n * size), gathered(n * size), block(n))
  allocate(ia(n), ib(n), counts(size), displs(size))
  counts = n

  do i = 1, n * size
    a(i) = value(rank, i)
    want(i) = 0
    do r = 0, size - 1
      want(i) = want(i) + value(r, i)
    end do
  end do

  call MPI_Allreduce(a, b, n * size, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD, ierr)
  call check(ierr == MPI_SUCCESS .and. all(b == want), "allreduce sum of doubles")

  b = a
  call MPI_Allreduce(MPI_IN_PLACE, b, n * size, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD, ierr)
  call check(ierr == MPI_SUCCESS .and. all(b == want), "allreduce in place")

  do i = 1, n
    ia(i) = mod(i * 5 + rank * 17, 97)
  end do
  call MPI_Allreduce(ia, ib, n, MPI_INTEGER, MPI_MAX, MPI_COMM_WORLD, ierr)
  call check(ierr == MPI_SUCCESS .and. all(ib == [(maxint(i), i = 1, n)]), "allreduce max of integers")

  call MPI_Reduce_scatter_block(a, block, n, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD, ierr)
  call check(ierr == MPI_SUCCESS .and. all(block == want(rank * n + 1:rank * n + n)), &
             "reduce_scatter_block")

  call MPI_Reduce_scatter(a, block, counts, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD, ierr)
  call check(ierr == MPI_SUCCESS .and. all(block == want(rank * n + 1:rank * n + n)), &
             "reduce_scatter of alike blocks")

  block = a(1:n)
  displs = [(r * n, r = 0, size - 1)]
  call MPI_Allgatherv(block, n, MPI_DOUBLE_PRECISION, gathered, counts, displs, &
                      MPI_DOUBLE_PRECISION, MPI_COMM_WORLD, ierr)
  call check(ierr == MPI_SUCCESS .and. all(gathered == [((value(r, i), i = 1, n), r = 0, size - 1)]), &
             "allgatherv, blocks end to end")

  displs = [((size - 1 - r) * n, r = 0, size - 1)]
  call MPI_Allgatherv(block, n, MPI_DOUBLE_PRECISION, gathered, counts, displs, &
                      MPI_DOUBLE_PRECISION, MPI_COMM_WORLD, ierr)
  call check(ierr == MPI_SUCCESS .and. &
             all(gathered == [((value(r, i), i = 1, n), r = size - 1, 0, -1)]), &
             "allgatherv, blocks in reverse order")

  block = a(1:n)
  call MPI_Allgather(block, n, MPI_DOUBLE_PRECISION, gathered, n, MPI_DOUBLE_PRECISION, &
                     MPI_COMM_WORLD, ierr)
  call check(ierr == MPI_SUCCESS .and. all(gathered == [((value(r, i), i = 1, n), r = 0, size - 1)]), &
             "allgather")

  gathered = 0
  gathered(rank * n + 1:rank * n + n) = a(1:n)
  call MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, gathered, n, MPI_DOUBLE_PRECISION, &
                     MPI_COMM_WORLD, ierr)
  call check(ierr == MPI_SUCCESS .and. all(gathered == [((value(r, i), i = 1, n), r = 0, size - 1)]), &
             "allgather in place")

  b = a
  call MPI_Bcast(b, n * size, MPI_DOUBLE_PRECISION, size - 1, MPI_COMM_WORLD, ierr)
  call check(ierr == MPI_SUCCESS .and. all(b == [(value(size - 1, i), i = 1, n * size)]), &
             "bcast from the last rank")

  call MPI_Barrier(MPI_COMM_WORLD, ierr)
  call check(ierr == MPI_SUCCESS, "barrier")

  ! The non-blocking forms, seven in flight, completed by MPI_Wait, an MPI_Test loop,
  ! MPI_Waitany and MPI_Waitall (squall's generalized requests under mpif.h and `use mpi`;
  ! MPI's own under `use mpi_f08`, whose non-blocking calls the library leaves to MPI).
  allocate(na(n * size), nb(n), nc(n * size), nd(n), ne(n * size), nf(n), ng(n * size))
  nd = a(1:n)
  nc = a
  call MPI_Iallreduce(a, na, n * size, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD, &
                      requests(1), ierr)
  call MPI_Ireduce_scatter_block(a, nb, n, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD, &
                                 requests(2), ierr)
  call MPI_Ibcast(nc, n * size, MPI_DOUBLE_PRECISION, 0, MPI_COMM_WORLD, requests(3), ierr)
  call MPI_Iallgather(nd, n, MPI_DOUBLE_PRECISION, ne, n, MPI_DOUBLE_PRECISION, MPI_COMM_WORLD, &
                      requests(4), ierr)
  call MPI_Ireduce_scatter(a, nf, counts, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD, &
                           requests(5), ierr)
  displs = [((size - 1 - r) * n, r = 0, size - 1)]
  call MPI_Iallgatherv(nd, n, MPI_DOUBLE_PRECISION, ng, counts, displs, MPI_DOUBLE_PRECISION, &
                       MPI_COMM_WORLD, requests(6), ierr)
  call MPI_Ibarrier(MPI_COMM_WORLD, requests(7), ierr)
  call MPI_Wait(requests(7), status, ierr)
  call check(ierr == MPI_SUCCESS .and. requests(7) == MPI_REQUEST_NULL, "ibarrier, MPI_Wait")
  flag = .false.
  do while (.not. flag)
    call MPI_Test(requests(1), flag, MPI_STATUS_IGNORE, ierr)
  end do
  call check(ierr == MPI_SUCCESS .and. requests(1) == MPI_REQUEST_NULL .and. all(na == want), &
             "iallreduce, an MPI_Test loop")
  call MPI_Waitany(7, requests, which, status, ierr)
  call check(ierr == MPI_SUCCESS .and. which >= 2 .and. which <= 6, "MPI_Waitany")
  call MPI_Waitall(7, requests, MPI_STATUSES_IGNORE, ierr)
  call check(ierr == MPI_SUCCESS .and. all([(requests(k) == MPI_REQUEST_NULL, k = 1, 7)]), &
             "MPI_Waitall")
  call check(all(nb == want(rank * n + 1:rank * n + n)), "ireduce_scatter_block")
  call check(all(nc == [(value(0, i), i = 1, n * size)]), "ibcast from rank 0")
  call check(all(ne == [((value(r, i), i = 1, n), r = 0, size - 1)]), "iallgather")
  call check(all(nf == want(rank * n + 1:rank * n + n)), "ireduce_scatter of alike blocks")
  call check(all(ng == [((value(r, i), i = 1, n), r = size - 1, 0, -1)]), &
             "iallgatherv, blocks in reverse order")

  call MPI_Finalize(ierr)

contains

  double precision function value(r, i)
    integer, intent(in) :: r, i
    value = dble(mod(i * 7 + r * 13, 61) - 30)
  end function

  integer function maxint(i)
    integer, intent(in) :: i
    integer :: q
    maxint = -1
    do q = 0, size - 1
      maxint = max(maxint, mod(i * 5 + q * 17, 97))
    end do
  end function

  subroutine check(ok, what)
    logical, intent(in) :: ok
    character(len=*), intent(in) :: what
    if (.not. ok) then
      print '(a, i0, a, a)', 'rank ', rank, ': WRONG ', what
      call MPI_Abort(MPI_COMM_WORLD, 1, ierr)
      stop 1
    end if
    if (rank == 0) print '(a, a)', 'ok: ', what
  end subroutine

end program
