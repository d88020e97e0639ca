/* Test target for Symbolizer.Unwind. leaky() calls clobber(), which, like
 * glibc's syscall wrappers, uses rbp as a general register, so that the
 * frame-pointer chain is garbage where it would make its syscall. There
 * clobber records what the BPF side records: its instruction pointer and the
 * stack words at its stack pointer. main prints them, with the word a
 * frame-pointer walk reads as the caller, then waits to be killed. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define SCAN_WORDS 32

uint64_t site_ip, site_rbp, scan[SCAN_WORDS];

/* clobber points rbp at this, as a wrapper may point it at the path it opens. */
char path[] = "/var/lib/app/workdir/state.db";

void clobber(void);

__asm__(".text\n"
	".globl clobber\n"
	".type clobber, @function\n"
	"clobber:\n"
	"\tpush %rbp\n"
	"\tsub $0x28, %rsp\n"
	/* Locals a wrapper keeps: flags, a stack address, -1. */
	"\tmovq $3, (%rsp)\n"
	"\tmovq $0x241, 0x8(%rsp)\n"
	"\tmov %rsp, 0x10(%rsp)\n"
	"\tmovq $0, 0x18(%rsp)\n"
	"\tmovq $-1, 0x20(%rsp)\n"
	"\tlea path(%rip), %rbp\n"
	".Lsite:\n"
	"\tlea .Lsite(%rip), %rax\n"
	"\tmov %rax, site_ip(%rip)\n"
	"\tmov %rbp, site_rbp(%rip)\n"
	"\tmov %rsp, %rsi\n"
	"\tlea scan(%rip), %rdi\n"
	"\tmov $32, %ecx\n"
	"\trep movsq\n"
	"\tadd $0x28, %rsp\n"
	"\tpop %rbp\n"
	"\tret\n"
	".size clobber, .-clobber\n"

	/* Never run: each ret_* label follows a call instruction of one form,
	 * each no_* label follows code that is no call. */
	".globl callsites\n"
	".type callsites, @function\n"
	"callsites:\n"
	"\tcall clobber\n"
	"ret_direct:\n"
	"\tcall *%rax\n"
	"ret_reg:\n"
	"\tcall *%r11\n"
	"ret_rex:\n"
	"\tcall *(%rax)\n"
	"ret_mem:\n"
	"\tcall *0x10(%rbx)\n"
	"ret_disp8:\n"
	"\tcall *0x1000(%rbx)\n"
	"ret_disp32:\n"
	"\tcall *site_ip(%rip)\n"
	"ret_rip:\n"
	"\tcall *0x8(%rsp)\n"
	"ret_sib_disp8:\n"
	"\tcall *0x1000(,%rax,8)\n"
	"ret_sib_disp32:\n"
	"\t.fill 8, 1, 0x90\n"
	"no_nops:\n"
	/* call rel32 whose target is far outside the code */
	"\t.byte 0xe8\n"
	"\t.long 0x40000000\n"
	"no_bad_target:\n"
	"\tjmp *%rax\n"
	"no_jmp:\n"
	"\tret\n"
	".size callsites, .-callsites\n"

	/* The bytes of call *%rax, but in data. */
	".section .rodata\n"
	"\t.byte 0xff, 0xd0\n"
	"no_data:\n"
	"\t.byte 0\n"
	".text\n");

volatile int sink;

__attribute__((noinline)) void leaky(void)
{
	clobber();
	sink++; /* no tail call: the return address must point into leaky */
}

int main(void)
{
	uint64_t caller;

	leaky();
	/* The kernel's frame-pointer walk takes the word above rbp's target as
	 * the caller's return address. */
	memcpy(&caller, (char *)site_rbp + 8, sizeof(caller));
	printf("%lx %lx", (unsigned long)site_ip, (unsigned long)caller);
	for (int i = 0; i < SCAN_WORDS; i++)
		printf(" %lx", (unsigned long)scan[i]);
	printf("\n");
	fflush(stdout);
	for (;;)
		pause();
}
