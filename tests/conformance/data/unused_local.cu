// Compiles with a warning: a local that is never read (kjit conformance data).
extern "C" __device__
int doubled_into(int *out, int a)
{
  int never_read;
  *out = a * 2;
  return 0;
}
