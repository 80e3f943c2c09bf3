// Device functions a kernel compiled elsewhere links against (kjit conformance data,
// numba-cuda's `link=` cases): C linkage, so the caller declares them by plain name.
extern "C" __device__
int doubled_into(int *out, int a)
{
  *out = a * 2;
  return 0;
}

extern "C" __device__
int copy_second_to_first(void *unused, int *pair)
{
  pair[0] = pair[1];
  return 0;
}
